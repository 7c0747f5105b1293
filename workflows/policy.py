"""Pure decisions of the certificate lifecycle, shared by the workflow and tests."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus
from certflow.activity_payloads import Outcome
from certflow.workflow_payloads import ProvisioningPolicy

DNS_CODES = frozenset(
    {
        ErrorCode.DNS_CNAME,
        ErrorCode.DNS_CAA,
        ErrorCode.DNS_DELEGATION,
        ErrorCode.DNS_PERSIST,
        ErrorCode.OWNERSHIP_UNVERIFIED,
    }
)
"""The DNS check's codes: ownership not proven, no method ready, or CAA refusing
(histories from before ACME_CAA also carry DNS_CAA from the CA's own CAA check)."""

NOT_READY_CODES = frozenset(
    {ErrorCode.DNS_CNAME, ErrorCode.DNS_DELEGATION, ErrorCode.DNS_PERSIST, ErrorCode.OWNERSHIP_UNVERIFIED}
)
"""No validation method ready (or ownership unproven): what abandons a hostname that
was never issued, and marks one that expired as DEPARTED."""

UNSENT_CHALLENGE_CODES = frozenset(
    {ErrorCode.HTTP01_UNREACHABLE, ErrorCode.DNS01_UPDATE, ErrorCode.DNS01_NOT_VISIBLE}
)
"""A challenge not ready to accept yet: the HTTP-01 self-check failed, or our dns-01
TXT is not written or not on every server. The CA was never asked to validate, so
the order is kept."""

RECHECK_CODES = DNS_CODES | UNSENT_CHALLENGE_CODES
"""Codes that wait on the DNS backoff (``dns_recheck_delay``) with the failure budget
untouched: the DNS codes and a challenge not ready to accept."""

TERMINAL_CODES = frozenset({ErrorCode.ACME_REJECTED})
"""Codes that make a certificate FAILED at once and get no slow automatic retry: the
CA refused the name or the request (docs/lifecycle.md, "Statuses and errors"); only the operator's
``retry`` reopens it. A FAILED certificate whose error code is not one of these
(ACME_FAILED) gets the slow automatic retry."""


def retries_automatically(code: ErrorCode | None) -> bool:
    """Whether a FAILED certificate with this error code gets the slow automatic retry."""
    return code not in TERMINAL_CODES


def decide_outcome(
    status: CertificateStatus,
    retry_count: int,
    has_order: bool,
    code: ErrorCode,
    max_failures: int = 3,
    charged: bool = True,
) -> Outcome:
    """What a failed attempt does to the certificate (the table of docs/lifecycle.md, "Statuses and errors").

    During a renewal (RENEWING, or EXPIRED once the old certificate lapsed) the
    status stays as it is where a first issuance would be PENDING/PROVISIONING.

    ACME_REJECTED (the CA refused the hostname or the request) is FAILED at once,
    whatever the budget, with its own code (not ACME_FAILED, so the CA's detail
    and the reason stay visible), the order cleared. The retry count goes +1: the
    attempt did fail (and spent an order against the CA's limits), so the count
    keeps meaning "failed attempts since the last success or reopen"; it never
    holds anything back, because ``retry`` (reopen_failed) resets it to 0.

    ACME_CAA (the CA's CAA check refused after ours allowed) is a failed
    authorization at the CA: budget +1, the (dead) order cleared, as
    ACME_INVALID_ORDER; the workflow then orders nothing more from that CA until
    its own reading of CAA changes (``CaaDisagreement``).

    HTTP01_UNREACHABLE (our HTTP-01 self-check, run before accept), DNS01_UPDATE and
    DNS01_NOT_VISIBLE (our dns-01 TXT not written, or not on every server) wait like the
    DNS codes — budget untouched, rechecked on the DNS backoff — but keeps the
    order, which is still valid since the CA was never asked to validate; the
    status is PENDING (the renewal status during a renewal), as for the DNS codes.

    ``charged=False`` for an attempt whose step no worker reported back on (killed or
    stalled: no verdict of the CA's and no fault of the network's): it keeps the
    budget, and the open order the workflow knows of, whatever its code.
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
    if not charged:
        # Only the order the workflow knows of: a lost place_order may have left one
        # on the row that the next attempt does not know; it is cleared, as before.
        return Outcome(
            status=waiting(has_order), retry_count=retry_count, keep_order=has_order, error_code=code
        )
    if code in UNSENT_CHALLENGE_CODES:
        # The order stays for the next try (the CA was never asked to validate), the
        # status says what the product must fix: still PENDING (docs/lifecycle.md, "Statuses and errors").
        return Outcome(
            status=waiting(False), retry_count=retry_count, keep_order=has_order, error_code=code
        )
    if code in DNS_CODES:
        return Outcome(
            status=waiting(False), retry_count=retry_count, keep_order=False, error_code=code
        )
    retry_count += 1
    if code in TERMINAL_CODES:
        return Outcome(
            status=CertificateStatus.FAILED,
            retry_count=retry_count,
            keep_order=False,
            error_code=code,
        )
    if retry_count >= max_failures:
        return Outcome(
            status=CertificateStatus.FAILED,
            retry_count=retry_count,
            keep_order=False,
            error_code=ErrorCode.ACME_FAILED,
        )
    keep = has_order and code not in (ErrorCode.ACME_INVALID_ORDER, ErrorCode.ACME_CAA)
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
    """When to renew (docs/lifecycle.md, "The lifecycle").

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


RENEWAL_JITTER = 0.10
"""Without ARI, renewals spread over the last 10 % of the lifetime before the renewal mark."""
BUDGET_ROOM = timedelta(days=2)
"""An ARI window that runs to notAfter leaves at least this much for failed attempts."""


def certificate_fraction(hostname: str, not_before: datetime) -> float:
    """A number in [0, 1) fixed for one certificate (its hostname and notBefore), so
    every run and every replay of its workflow picks the same renewal time, while
    certificates issued together spread out."""
    digest = hashlib.sha256(f"{hostname}|{not_before.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def spread_renewal_time(
    not_before: datetime,
    not_after: datetime,
    ari_window: tuple[datetime, datetime] | None,
    fraction: float,
) -> datetime:
    """When to renew, spread so certificates issued together do not renew together
    (docs/lifecycle.md, "The lifecycle"; ``fraction`` from :func:`certificate_fraction`).

    In the CA's ARI window at ``fraction`` — but a window that runs to (within
    BUDGET_ROOM of) notAfter is cut to its first half or BUDGET_ROOM before
    notAfter, whichever is earlier, leaving room for the failure budget.
    Without a window: at the lifetime rule's mark (1/3 of the lifetime left, 1/2
    under 10 days) less up to RENEWAL_JITTER of the time before it.
    """
    fraction = min(max(fraction, 0.0), 1.0)
    if ari_window is not None:
        start, end = ari_window
        if end <= start:
            return start
        if end >= not_after - BUDGET_ROOM:
            end = max(start, min(start + (end - start) / 2, not_after - BUDGET_ROOM))
        return start + (end - start) * fraction
    mark = renewal_time(not_before, not_after, None, 0.0)
    return mark - (mark - not_before) * RENEWAL_JITTER * fraction


COOLDOWN_SPREAD_MIN = 5.0
COOLDOWN_SPREAD_FRACTION = 0.10


def cooldown_spread(cooldown_seconds: float, fraction: float) -> float:
    """Extra seconds after a cooldown ends before this workflow orders again: uniform
    over max(5 s, 10 % of the cooldown), so the workflows waiting on one cooldown do
    not all send their orders in the same instant (``fraction`` in [0, 1))."""
    window = max(COOLDOWN_SPREAD_MIN, COOLDOWN_SPREAD_FRACTION * cooldown_seconds)
    return window * min(max(fraction, 0.0), 1.0)


def choose_issuer(
    allowed: Sequence[str], preferred: str | None, passed_over: Collection[str]
) -> str | None:
    """The issuer of the next attempt: of those CAA allows (in order of preference),
    the ones not fallen back from; the preferred one (a renewal's: the CA of the
    current certificate) among them, else the first. When every allowed issuer was
    fallen back from, all are candidates again. None when no issuer is known (a
    history from before issuers: the one CA there was)."""
    candidates = [name for name in allowed if name not in passed_over] or list(allowed)
    if preferred is not None and preferred in candidates:
        return preferred
    return candidates[0] if candidates else None


def fallback_issuers(allowed: Sequence[str], current: str | None, passed_over: Collection[str]) -> list[str]:
    """The issuers an attempt at ``current`` could fall back to."""
    return [name for name in allowed if name != current and name not in passed_over]


def issuer_reason(
    chosen: str | None,
    configured: Sequence[str],
    allowed: Sequence[str],
    passed_over: Mapping[str, str],
    preferred: str | None,
) -> str | None:
    """Why the attempt goes to ``chosen`` rather than the first configured issuer
    (None when it goes to the first): for each issuer ahead of it, CAA or the
    fallback that passed it over, or the renewal staying with its CA."""
    if chosen is None or not configured or chosen == configured[0]:
        return None
    ahead = configured[: configured.index(chosen)] if chosen in configured else list(configured)
    reasons = []
    for name in ahead:
        if name not in allowed:
            reasons.append(f"CAA does not allow {name}")
        elif name in passed_over:
            reasons.append(f"fell back from {passed_over[name]}")
    if not reasons and chosen == preferred:
        reasons.append("the renewal stays with the CA of the current certificate")
    return "; ".join(reasons) or None


def fallback_outcome(status: CertificateStatus, code: ErrorCode) -> Outcome:
    """A failure that spent the budget at one issuer, when another may issue: a fresh
    budget there instead of FAILED, the order dropped (it belongs to the old CA)."""
    in_renewal = status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
    return Outcome(
        status=status if in_renewal else CertificateStatus.PENDING,
        retry_count=0,
        keep_order=False,
        error_code=code,
    )
