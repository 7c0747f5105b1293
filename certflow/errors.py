"""The typed error tree.

Every failure an activity can report is a :class:`ProvisioningError` carrying an
:class:`ErrorCode` (docs/lifecycle.md, "Statuses and errors") plus the data that explains it. Activities turn
them into Temporal ``ApplicationError`` s whose ``type`` is the code, so the
workflow and retry policies match on the code, never on message text. What the
client refuses to do for its caller is an :class:`ActionRejectedError`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Error codes stored in ``certificates.provisioning_error``."""

    DNS_CNAME = "DNS_CNAME"
    DNS_CAA = "DNS_CAA"
    ACME_RATE_LIMITED = "ACME_RATE_LIMITED"
    ACME_INVALID_ORDER = "ACME_INVALID_ORDER"
    ACME_TEMPORARY = "ACME_TEMPORARY"
    ACME_FAILED = "ACME_FAILED"
    ACME_REJECTED = "ACME_REJECTED"
    ACME_CAA = "ACME_CAA"
    """The CA's own CAA check refused although ours allowed (a failed authorization)."""
    HTTP01_UNREACHABLE = "HTTP01_UNREACHABLE"
    INVALID_HOSTNAME = "INVALID_HOSTNAME"
    DNS_DELEGATION = "DNS_DELEGATION"
    """dns-01: ``_acme-challenge.<host>`` is no CNAME to our label (yet)."""
    DNS_PERSIST = "DNS_PERSIST"
    """dns-persist-01: no ``_validation-persist`` record authorizes our CA and account."""
    DNS01_UPDATE = "DNS01_UPDATE"
    """dns-01: our own zone's primary refused the signed update (its rcode in the message)."""
    DNS01_NOT_VISIBLE = "DNS01_NOT_VISIBLE"
    """dns-01: the TXT is not on every authoritative server of our zone yet."""
    OWNERSHIP_UNVERIFIED = "OWNERSHIP_UNVERIFIED"
    """With REQUIRE_OWNERSHIP: the tenant's ``_certflow`` TXT is not seen (yet)."""
    ABANDONED = "ABANDONED"
    """CANCELED: PENDING with no validation method ready for PENDING_TIMEOUT_DAYS."""
    DEPARTED = "DEPARTED"
    """EXPIRED: the hostname no longer routes to us and has no DNS method."""


USER_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.DNS_CNAME: "DNS is not configured correctly yet. Check the CNAME record.",
    ErrorCode.DNS_CAA: "DNS CAA records do not allow our certificate authority.",
    ErrorCode.ACME_RATE_LIMITED: (
        "Certificate authority is temporarily rate-limiting. We will retry automatically."
    ),
    ErrorCode.ACME_INVALID_ORDER: (
        "Domain ownership could not be verified. We will retry automatically."
    ),
    ErrorCode.ACME_TEMPORARY: (
        "Certificate provisioning hit a temporary error. We will retry automatically."
    ),
    ErrorCode.ACME_FAILED: (
        "Certificate provisioning failed. Contact support if this persists."
    ),
    ErrorCode.ACME_REJECTED: (
        "The certificate authority refused this hostname. Contact support."
    ),
    ErrorCode.ACME_CAA: (
        "The certificate authority found DNS CAA records that do not allow it."
        " Check the CAA records of this hostname and its parents."
    ),
    ErrorCode.INVALID_HOSTNAME: "This is not a hostname a certificate can be issued for.",
    ErrorCode.HTTP01_UNREACHABLE: (
        "The HTTP challenge could not be reached. Check that /.well-known/acme-challenge/"
        " is routed to us."
    ),
    ErrorCode.DNS_DELEGATION: (
        "DNS validation is not delegated yet. Add the _acme-challenge CNAME record shown."
    ),
    ErrorCode.DNS_PERSIST: (
        "The persistent validation record is missing or wrong. Add the"
        " _validation-persist TXT record shown."
    ),
    ErrorCode.DNS01_UPDATE: "Our DNS for validation refused an update. We are on it.",
    ErrorCode.ABANDONED: "The setup was never finished, so we stopped trying. Request it again.",
    ErrorCode.DEPARTED: "This hostname no longer points to us; its certificate expired.",
    ErrorCode.OWNERSHIP_UNVERIFIED: (
        "Ownership of this hostname is not proven yet. Add the _certflow TXT record shown."
    ),
    ErrorCode.DNS01_NOT_VISIBLE: (
        "The validation record is not on every DNS server yet. We will retry automatically."
    ),
}


class FailureType(StrEnum):
    """The ApplicationError types an activity raises besides an ErrorCode's (a step's
    failure carries its ErrorCode as its type): each ends a workflow or a retry, none
    is stored on the row. The values are in recorded histories."""

    CERTIFICATE_GONE = "CERTIFICATE_GONE"
    """The row was deleted under the workflow (load_certificate, reopen_failed)."""
    INVALID_HOSTNAME = "InvalidHostnameError"
    """A workflow a backend started itself names an invalid or non-canonical hostname."""
    WEBHOOK_GONE = "WEBHOOK_GONE"
    """The webhook receiver answered 410: no more attempts."""
    WEBHOOK_FAILED = "WEBHOOK_FAILED"
    """The webhook receiver answered another error: retried."""


class CertflowError(Exception):
    """The root of every error certflow raises."""


class ConfigError(CertflowError):
    """A setting is missing or malformed; the message names the variable."""


class ServiceUnreachableError(CertflowError):
    """Postgres or Temporal did not answer (refused, a name that does not resolve,
    TLS, no answer in time) or refused the connection: the message names the
    service, its address (never a password) and the setting to check."""

    def __init__(
        self, service: str, address: str, setting: str, reason: str, *, reached: bool = False
    ) -> None:
        self.service = service
        self.address = address
        self.setting = setting
        self.reason = reason
        verb = "cannot connect to" if reached else "cannot reach"
        super().__init__(f"{verb} {service} at {address} ({setting}): {reason}")


class CaUnreachableError(ConfigError):
    """A CA did not answer at start-up (after retries): for a fallback issuer the
    worker starts without its account and registers it on first use."""


class ActionRejectedError(CertflowError):
    """The workflow refused an action (nothing to retry, not ACTIVE, …) or has none to take it."""


class HostnameOwnedError(ActionRejectedError):
    """A requested hostname belongs to another tenant (which is not named)."""

    def __init__(self, hostnames: Sequence[str]) -> None:
        self.hostnames = list(hostnames)
        names = ", ".join(self.hostnames)
        one = len(self.hostnames) == 1
        super().__init__(
            f"{names} {'belongs' if one else 'belong'} to another tenant; nothing was requested"
        )


@dataclass
class ProvisioningError(CertflowError):
    """A provisioning failure with its code and a specific, user-safe message."""

    code: ErrorCode
    message: str

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def details(self) -> dict[str, Any]:
        """JSON-safe data carried to the workflow in the ApplicationError details."""
        return {"code": str(self.code), "message": self.message}

    @property
    def non_retryable(self) -> bool:
        """Whether an activity retry could not help (the workflow decides what next)."""
        return self.code is not ErrorCode.ACME_TEMPORARY

    @property
    def next_retry_delay(self) -> timedelta | None:
        return None


@dataclass
class StoreUnavailableError(ProvisioningError):
    """Postgres did not answer a step (refused, reset, shutting down, starting up):
    our own infrastructure failed, as a killed worker does, so an attempt it ends is
    recorded but not charged to the certificate's failure budget."""

    code: ErrorCode = ErrorCode.ACME_TEMPORARY
    message: str = "Postgres did not answer"

    def details(self) -> dict[str, Any]:
        return {**super().details(), "store_unavailable": True}


@dataclass
class DnsCheckError(ProvisioningError):
    """The hostname's DNS does not allow issuance (DNS_CNAME / DNS_CAA) or the
    lookup itself failed (ACME_TEMPORARY for a CAA SERVFAIL)."""

    found: list[str] = field(default_factory=list)
    expected: str = ""

    def details(self) -> dict[str, Any]:
        return {**super().details(), "found": list(self.found), "expected": self.expected}


@dataclass
class AcmeProblemError(ProvisioningError):
    """The CA answered with an error (RFC 8555 problem document or bare HTTP status).

    For a rate limit, what ``certflow.acme.problems`` read from it: the scope
    (``account`` / ``registered_domain`` / ``hostname``), the rate-limits page
    anchor and Boulder's limit name; ``paused`` with the CA portal's
    ``unpause_url`` for a paused hostname.
    """

    problem_type: str = ""
    detail: str = ""
    http_status: int | None = None
    retry_after_seconds: float | None = None
    subproblems: list[dict[str, Any]] = field(default_factory=list)
    limit_scope: str | None = None
    limit_anchor: str | None = None
    limit_name: str | None = None
    paused: bool = False
    unpause_url: str | None = None
    unreachable: bool = False
    """No answer from the CA at all (connection refused or reset, timeout, a bare
    502/503/504): counts toward falling back to another issuer."""
    accepted: bool = False
    """The CA answered this attempt's accept of the challenge before the failure: the
    challenge must never be POSTed again (Boulder starts another validation)."""

    def details(self) -> dict[str, Any]:
        return {
            **super().details(),
            "problem_type": self.problem_type,
            "detail": self.detail,
            "http_status": self.http_status,
            "retry_after_seconds": self.retry_after_seconds,
            "subproblems": list(self.subproblems),
            "limit_scope": self.limit_scope,
            "limit_anchor": self.limit_anchor,
            "limit_name": self.limit_name,
            "paused": self.paused,
            "unpause_url": self.unpause_url,
            "unreachable": self.unreachable,
            "accepted": self.accepted,
        }

    @property
    def non_retryable(self) -> bool:
        # A short Retry-After on a temporary fault is honoured by the activity's
        # own retry; everything else goes back to the workflow.
        return self.code is not ErrorCode.ACME_TEMPORARY

    @property
    def next_retry_delay(self) -> timedelta | None:
        if self.retry_after_seconds is None:
            return None
        return timedelta(seconds=self.retry_after_seconds)


def to_application_error(err: ProvisioningError) -> Exception:
    """The Temporal form of err: ``type`` is the code, details carry the data.

    Called from activities; it also logs the failure with its data, at error
    level for temporary ACME errors and warning for the rest (as the original).
    """
    from temporalio import activity
    from temporalio.exceptions import ApplicationError

    level = logging.ERROR if err.code is ErrorCode.ACME_TEMPORARY else logging.WARNING
    fields = {
        k: v for k, v in err.details().items() if v is not False and v not in (None, "", [])
    }
    fields["error_code"] = fields.pop("code")
    fields["error_message"] = fields.pop("message")
    logger = activity.logger if activity.in_activity() else logging.getLogger("certflow")
    logger.log(level, "certificate step failed: %s", err.message, extra=fields)

    return ApplicationError(
        err.message,
        err.details(),
        type=str(err.code),
        non_retryable=err.non_retryable,
        next_retry_delay=err.next_retry_delay,
    )
