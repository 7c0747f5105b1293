"""The vocabulary every side shares: a certificate's statuses and its workflow's
phases, ACME statuses, validation methods, rate-limit scopes and order kinds; and
the rows as certflow reads them (a certificate, its events, a cooldown).

What clients and workflows exchange is in ``workflow_payloads``; what the
workflows and their activities exchange, in ``activity_payloads``. Nothing here
ever holds key material: private keys stay inside the activity that uses them and
in Postgres, encrypted.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from certflow.errors import ErrorCode
from certflow.hostnames import Hostname


class CertificateStatus(StrEnum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    ACTIVE = "ACTIVE"
    RENEWING = "RENEWING"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"
    CANCELED = "CANCELED"


class AcmeStatus(StrEnum):
    """Statuses of ACME orders, authorizations and challenges (RFC 8555 §7.1.6)."""

    PENDING = "pending"
    READY = "ready"
    PROCESSING = "processing"
    VALID = "valid"
    INVALID = "invalid"
    DEACTIVATED = "deactivated"


ISSUABLE = frozenset({AcmeStatus.READY, AcmeStatus.VALID})
"""Order statuses that let finalize_and_store go on (ready: finalize; valid: a
finalize happened before, pair the stored key)."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class ValidationMethod(StrEnum):
    """How the CA is shown control of a hostname (the ACME challenge type)."""

    HTTP_01 = "http-01"
    """The CA fetches the challenge from the hostname, routed to the edge."""
    DNS_01 = "dns-01"
    """The CA reads a TXT the hostname delegates into our zone (``_acme-challenge``
    CNAME): before any traffic moves, and for wildcards."""
    DNS_PERSIST_01 = "dns-persist-01"
    """The CA reads a TXT the customer published once naming it and our account
    (draft-ietf-acme-dns-persist): no DNS write at all."""


class RequestedMethod(StrEnum):
    """The validation method a request asks for: one, or ``auto`` (at each attempt
    the first ready: a persist record, the delegation, routing to the edge)."""

    AUTO = "auto"
    HTTP_01 = "http-01"
    DNS_01 = "dns-01"
    DNS_PERSIST_01 = "dns-persist-01"


class DnsRecord(Frozen):
    """A DNS record to tell the customer to add, copyable as it is."""

    name: str
    type: str
    value: str


class MethodReadiness(Frozen):
    """Whether one validation method is ready for a hostname, and what to add."""

    method: ValidationMethod
    ready: bool
    detail: str
    """What was found: why it is ready, or what is missing."""
    record: DnsRecord | None = None
    """The record the customer adds for this method (None for http-01 behind a CNAME
    the product already told them of)."""
    caa_allowed: bool | None = None
    caa: str | None = None
    """What CAA says of issuing with this method (RFC 8657 ``validationmethods``
    and ``accounturi`` included), judged as the CA will; None: not looked up."""


class LimitScope(StrEnum):
    """What a CA rate limit holds back (the scope of its cooldown)."""

    ACCOUNT = "account"
    REGISTERED_DOMAIN = "registered_domain"
    HOSTNAME = "hostname"


class OrderKind(StrEnum):
    """How Let's Encrypt counts a new order against its limits (docs/rate-limits.md)."""

    NEW = "new"
    """A first certificate for the hostname: every limit applies."""
    RENEWAL = "renewal"
    """The same identifier set as a certificate already issued: exempt from new
    orders per account and certificates per registered domain."""
    ARI_RENEWAL = "ari_renewal"
    """A renewal naming the certificate it ``replaces`` inside its ARI window:
    exempt from every limit but the overall request rate."""


class Cooldown(Frozen):
    """A CA rate-limit cooldown in force (``acme_cooldowns``)."""

    directory_url: str
    scope: LimitScope
    scope_key: str
    """'' for the account; the registered domain or the hostname otherwise."""
    limit_name: str
    """Boulder's name for the limit (``NewOrdersPerAccount``, …), ``OverallRequests``
    for a 503, ``Unknown`` when the CA's answer named none."""
    until: datetime
    problem_type: str | None = None
    detail: str | None = None


class CertificateRecord(Frozen):
    """A certificate row as the workflow sees it (no key material, no PEMs)."""

    certificate_id: str
    hostname: Hostname
    tenant_id: str | None
    status: CertificateStatus
    error_code: ErrorCode | None = None
    error_message: str | None = None
    retry_count: int = 0
    order_url: str | None = None
    challenge_url: str | None = None
    not_before: datetime | None = None
    expires_at: datetime | None = None
    skips_dns: bool = False
    ari_window_start: datetime | None = None
    ari_window_end: datetime | None = None
    """The CA's suggested renewal window (RFC 9773), as the renewal-info sweep read it."""
    serial: str | None = None
    """The current certificate's serial (a window is for one certificate)."""
    issuer: str | None = None
    """The issuer of the current certificate (None: the first configured)."""
    order_issuer: str | None = None
    """The issuer of the attempt under way, and of the open order when there is one."""
    issued_at: datetime | None = None
    """When the current certificate was stored (its notBefore may be backdated: Let's
    Encrypt backdates by an hour); None in histories from before it was kept."""
    requested_method: RequestedMethod = RequestedMethod.AUTO
    """The validation method the request asked for."""
    validation_method: ValidationMethod | None = None
    """The method of the open order, or of the last attempt (None: http-01, in rows
    and histories from before methods)."""

    @property
    def ari_window(self) -> tuple[datetime, datetime] | None:
        if self.ari_window_start is None or self.ari_window_end is None:
            return None
        return (self.ari_window_start, self.ari_window_end)


class Phase(StrEnum):
    """What the Certificate workflow is doing (the ``phase`` of its status)."""

    STARTING = "starting"
    CHECKING_DNS = "checking DNS"
    CHECKING_HTTP01 = "checking the challenge is reachable"
    """Shown by the retired designs 1 and 2 only, as are CREATING_ORDER,
    ACCEPTING_CHALLENGE and ASKING_RENEWAL_INFO: kept while a worker of the release
    before may still answer a status query (docs/changing-the-workflow.md)."""
    PUBLISHING_DNS01 = "publishing the dns-01 TXT in our zone"
    CREATING_ORDER = "creating order"
    ORDERING = "creating the order and validating its challenge"
    """The order placed, self-checked, accepted and polled in one activity."""
    ACCEPTING_CHALLENGE = "accepting challenge"
    POLLING_ORDER = "polling order"
    ORDER_PENDING = "order pending; polling again"
    ORDER_PROCESSING = "order processing; polling again"
    FINALIZING = "finalizing"
    ISSUED = "issued"
    WAITING_FOR_RATE_LIMIT = "waiting for the CA's rate limit to end"
    WAITING_FOR_DNS = "waiting for DNS to be fixed"
    WAITING_FOR_HTTP01 = "waiting for the challenge to be reachable"
    WAITING_FOR_DNS01 = "waiting for our dns-01 TXT to be on every name server"
    WAITING_BEFORE_RETRY = "waiting before the next attempt"
    FAILED_WAITING = "failed; waiting for retry"
    ASKING_RENEWAL_INFO = "asking the CA when to renew"
    WAITING_FOR_RENEWAL = "active; waiting for the renewal time"
    WAITING_FOR_RENEWAL_INFO = (
        "active; the CA's window opened at once again: waiting for its next renewal-info answer"
    )
    RENEWING = "renewing"
    TRANSFERRING = "transferring to another tenant"
    CANCELING = "canceling"
    REVOKING = "revoking"
    CANCELED = "canceled"
    DELETED = "deleted"
    NOT_DELETED = "canceled; not deleted: revocation failed"
    ABANDONED = "abandoned: no validation method was ready in time"
    DEPARTED = "departed: expired, and no longer routed to us"
    ROW_MOVED_ON = "the certificate row moved on"
    ROW_GONE = "the certificate row is gone"

    @classmethod
    def polling_again(cls, status: AcmeStatus) -> Phase:
        """The wait between order checks, named by what the order still is."""
        return cls.ORDER_PROCESSING if status is AcmeStatus.PROCESSING else cls.ORDER_PENDING


class CertificateEvent(Frozen):
    """One transition of a certificate (``certificate_events``)."""

    at: datetime
    from_status: str | None
    to_status: str
    error_code: str | None
    message: str | None
