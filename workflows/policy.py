"""Pure decisions of the certificate lifecycle, shared by the workflow and tests."""

from __future__ import annotations

from datetime import datetime, timedelta

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, Outcome, ProvisioningPolicy

DNS_CODES = frozenset({ErrorCode.DNS_CNAME, ErrorCode.DNS_CAA})


def decide_outcome(
    status: CertificateStatus,
    retry_count: int,
    has_order: bool,
    code: ErrorCode,
    max_failures: int = 3,
) -> Outcome:
    """What a failed attempt does to the certificate (SPEC §4's table).

    During a renewal (RENEWING, or EXPIRED once the old certificate lapsed) the
    status stays as it is where a first issuance would be PENDING/PROVISIONING.
    """
    in_renewal = status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)

    def waiting(order_kept: bool) -> CertificateStatus:
        if in_renewal:
            return status
        return CertificateStatus.PROVISIONING if order_kept else CertificateStatus.PENDING

    if code is ErrorCode.ACME_RATE_LIMITED:
        return Outcome(
            status=waiting(has_order), retry_count=retry_count, keep_order=True, error_code=code
        )
    if code in DNS_CODES:
        return Outcome(
            status=waiting(False), retry_count=retry_count, keep_order=False, error_code=code
        )
    retry_count += 1
    if retry_count >= max_failures:
        return Outcome(
            status=CertificateStatus.FAILED,
            retry_count=retry_count,
            keep_order=False,
            error_code=ErrorCode.ACME_FAILED,
        )
    keep = has_order and code is not ErrorCode.ACME_INVALID_ORDER
    return Outcome(status=waiting(keep), retry_count=retry_count, keep_order=keep, error_code=code)


def dns_recheck_delay(consecutive_dns_failures: int, policy: ProvisioningPolicy) -> float:
    """Seconds before re-checking DNS: starts at the initial delay, doubles, caps."""
    exponent = min(max(consecutive_dns_failures - 1, 0), 30)
    return float(min(policy.dns_recheck_initial_seconds * 2**exponent, policy.dns_recheck_max_seconds))


def failure_backoff(retry_count: int, policy: ProvisioningPolicy) -> float:
    """Seconds before the next attempt after the retry_count-th failure."""
    exponent = min(max(retry_count - 1, 0), 30)
    return float(
        min(policy.failure_backoff_initial_seconds * 2**exponent, policy.failure_backoff_max_seconds)
    )


def order_poll_delay(attempt: int, retry_after: float | None) -> float:
    """Durable wait between order checks once the fast in-activity window is over."""
    backoff = float(min(2**attempt, 60))
    return max(backoff, retry_after or 0.0)


SHORT_LIFETIME = timedelta(days=10)


def renewal_time(
    not_before: datetime,
    not_after: datetime,
    ari_window: tuple[datetime, datetime] | None,
    fraction: float,
) -> datetime:
    """When to renew (SPEC §6).

    Inside the CA's ARI suggested window when it gives one, at ``fraction``
    (0..1, drawn once per workflow run so renewals of many certificates spread
    out); otherwise when 1/3 of the lifetime remains, 1/2 for lifetimes under
    10 days.
    """
    fraction = min(max(fraction, 0.0), 1.0)
    if ari_window is not None:
        start, end = ari_window
        if end > start:
            return start + (end - start) * fraction
        return start
    lifetime = not_after - not_before
    remaining = lifetime / 2 if lifetime < SHORT_LIFETIME else lifetime / 3
    return not_after - remaining
