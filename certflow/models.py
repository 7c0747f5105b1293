"""Payloads exchanged between the workflow, activities and clients.

Nothing here ever holds key material: private keys stay inside the activity
that uses them and in Postgres, encrypted.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from certflow.errors import ErrorCode

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


class LimitScope(StrEnum):
    """What a CA rate limit holds back (the scope of its cooldown)."""

    ACCOUNT = "account"
    REGISTERED_DOMAIN = "registered_domain"
    HOSTNAME = "hostname"


class OrderKind(StrEnum):
    """How Let's Encrypt counts a new order against its limits (SPEC §4)."""

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


class CertificateInput(Frozen):
    """Input of the Certificate workflow (the product backend's contract:
    ``hostname`` and optional ``tenant_id``)."""

    hostname: str
    tenant_id: str | None = None
    method: RequestedMethod | None = None
    """How the CA is to be shown control (``auto``, ``http-01``, ``dns-01``,
    ``dns-persist-01``); None keeps the row's (``auto`` for a new one)."""
    carried: CertificateRecord | None = None
    """Set by certflow itself on continue-as-new; never by a client."""
    waits: CarriedWaits | None = None
    """Set by certflow itself when a long wait continues as new; never by a client."""
    policy: ProvisioningPolicy | None = None
    """Set by certflow itself on the continue-as-new after an issuance: the new run
    starts from ``carried`` and this policy without reading the row again."""


class CaaDisagreement(Frozen):
    """A CA refused on CAA although our check allowed: no new order goes to it for
    this hostname until our reading of CAA changes (or ``retry``)."""

    reading: str | None
    """The deciding CAA set as we read it when the CA refused (None: not read in
    that attempt; the next reading becomes the one to change from)."""
    detail: str
    """The CA's words."""


class CarriedWaits(Frozen):
    """What a run that continued as new in the middle of waiting hands to the next."""

    dns_failures: int = 0
    """Consecutive DNS / self-check failures: the recheck backoff goes on growing."""
    pending_since: datetime | None = None
    """Since when a never-issued hostname has had no validation method ready."""
    departed_at: datetime | None = None
    """When the certificate expired with the hostname no longer routed to us."""
    warned_expiring: bool = False
    """``expiring_soon`` was sent for this certificate."""
    passed_over: dict[str, str] = {}
    """Issuers this certificate fell back from, with why (cooldown, budget, down)."""
    unreachable_since: datetime | None = None
    """Since when the attempt's issuer has been unreachable, while it is."""
    caa_disagreements: dict[str, CaaDisagreement] = {}
    """Issuers whose own CAA check refused this hostname, by issuer name."""
    accepted_challenge: str | None = None
    """The challenge the CA answered an accept for: never POSTed again."""
    retry_requested: bool = False
    """A ``retry`` had come and not yet cut a wait short when the run handed over."""
    renewed_at_once: bool = False
    """The certificate waited on replaced one that renewed at once, for an ARI window
    already open when it was an hour old or less: a second such window waits for the
    renewal-info sweep's next answer instead (no renewal loop)."""


class ProvisioningPolicy(Frozen):
    """Timing knobs from the worker's settings, recorded in history by an activity."""

    dns_recheck_initial_seconds: float = 60.0
    dns_recheck_max_seconds: float = 3600.0
    failure_backoff_initial_seconds: float = 900.0
    failure_backoff_max_seconds: float = 4 * 3600.0
    order_fast_poll_seconds: float = 8.0
    failed_retry_seconds: float = 86400.0
    """Slow automatic retry of a FAILED certificate; 0 turns it off."""
    max_failures: int = 3
    webhooks: bool = False
    expiring_soon_days: float = 7.0
    search_attributes: bool = False
    """Whether the worker registered certflow's search attributes (see certflow.search)."""
    http01_self_check: bool = True
    """Fetch the challenge as the CA would before accepting it (SPEC §3.1)."""
    issuers: list[str] = []
    """The configured issuers' names, in order of preference (empty in histories
    from before issuers: then every step goes to the one CA there was)."""
    issuer_fallback_cooldown_seconds: float = 3600.0
    issuer_fallback_unreachable_seconds: float = 3600.0
    pending_timeout_days: float = 14.0
    """A hostname PENDING this long with no validation method ready is CANCELED
    (ABANDONED); 0: never."""
    departed_retention_days: float = 30.0
    """An EXPIRED hostname that no longer routes to us (DEPARTED) stops re-checking
    this long after it expired; 0: never."""


class GiveUpInput(Frozen):
    """Stop trying for a hostname: CANCELED (ABANDONED) or EXPIRED (DEPARTED)."""

    certificate_id: str
    status: CertificateStatus
    code: ErrorCode
    message: str


class CertificateRecord(Frozen):
    """A certificate row as the workflow sees it (no key material, no PEMs)."""

    certificate_id: str
    hostname: str
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


class EnsureCertificateInput(Frozen):
    hostname: str
    tenant_id: str | None = None
    method: RequestedMethod | None = None
    """The validation method a backend's workflow input asked for (None: the row's)."""


class EnsureCertificateResult(Frozen):
    record: CertificateRecord
    policy: ProvisioningPolicy


class CheckDnsInput(Frozen):
    hostname: str
    method: RequestedMethod | None = None
    """The method to check for (None: the one the row asks for)."""


class DnsVerdict(Frozen):
    """What check_dns found: the issuers CAA lets issue, in order of preference
    (check_dns in histories from before issuers returned nothing), the deciding CAA
    set as we read it (None in histories from before it was kept), and the
    validation methods ready, in order of preference (empty in histories from before
    methods: http-01)."""

    allowed_issuers: list[str]
    caa_reading: str | None = None
    methods: list[ValidationMethod] = []
    method_reason: str | None = None
    """Why the first method (a line for the row and the events)."""


class CreateOrderInput(Frozen):
    hostname: str


class PlaceOrderInput(Frozen):
    certificate_id: str
    hostname: str
    kind: OrderKind = OrderKind.NEW
    """How the CA counts this order against its limits: a renewal (an ARI renewal
    inside its window) is exempt from some cooldowns, and names what it replaces."""
    issuer: str | None = None
    """The CA to order from (None: the first configured)."""
    issuer_reason: str | None = None
    """Why this issuer, when it is not the first choice (recorded as an event)."""
    methods: list[ValidationMethod] = []
    """The validation methods ready for this attempt, in order of preference: the
    first the CA offers is answered (empty: http-01, as before methods)."""
    method_reason: str | None = None
    """Why the first of them (stored on the row with the order)."""


class OpenedOrder(Frozen):
    """A new ACME order and its challenge. The key authorization is public by design
    (the CA fetches it over plain HTTP, or reads its digest in DNS). The
    authorization URL is not stored: an order read back from the row has none."""

    order_url: str
    authorization_url: str | None = None
    challenge_url: str
    token: str
    key_authorization: str
    replaces: str | None = None
    """The RFC 9773 certID of the certificate this order renews, when sent."""
    method: ValidationMethod | None = None
    """The challenge's type (None: http-01, as before methods)."""


class Http01CheckInput(Frozen):
    """The self-check of the challenge persisted for this certificate (before accept)."""

    certificate_id: str
    hostname: str


class TransferRequest(Frozen):
    """The ``transfer`` update: move the hostname to another tenant, once that tenant
    has proven ownership (its ``_certflow`` TXT)."""

    to_tenant: str


class TransferInput(Frozen):
    certificate_id: str
    hostname: str
    to_tenant: str


class Transferred(Frozen):
    """The row after a transfer, and the tenant it had."""

    record: CertificateRecord
    from_tenant: str | None


class Dns01ChallengeInput(Frozen):
    """The dns-01 challenge persisted for this certificate: its TXT to publish in our
    zone (before accept), or to withdraw (after the order)."""

    certificate_id: str
    hostname: str


class DomainCheckInput(Frozen):
    hostname: str
    tenant_id: str | None = None
    """Also check that this tenant has proven ownership (None: no ownership check)."""


class DomainCheck(Frozen):
    """One pre-check of a domain: ``cname``, ``caa`` or ``http01``."""

    name: str
    ok: bool
    message: str
    """What was found: why it passes, or what to fix."""
    code: ErrorCode | None = None


class DomainCheckReport(Frozen):
    """Every pre-check of one hostname (``starter.py check``), nothing ordered."""

    hostname: str
    checks: list[DomainCheck]
    methods: list[MethodReadiness] = []
    """Each validation method: ready or not, and the record to add for it."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


class PersistChallengeInput(Frozen):
    certificate_id: str
    order: OpenedOrder


class AcceptChallengeInput(Frozen):
    challenge_url: str
    issuer: str | None = None


class WaitForOrderInput(Frozen):
    order_url: str
    challenge_url: str | None
    within_seconds: float
    accept_first: bool = False
    """Ask the CA to validate the challenge before polling (after place_order), unless
    it was asked already."""
    issuer: str | None = None
    """The CA of the order (None: the first configured)."""
    accept_unsure: bool = False
    """An accept may have reached the CA before (a kept order): read the challenge
    first and POST only while the CA shows it pending."""


class OrderProgress(Frozen):
    """Order status after waiting; ``retry_after_seconds`` is the CA's hint."""

    status: AcmeStatus
    retry_after_seconds: float | None = None


class FinalizeInput(Frozen):
    certificate_id: str
    hostname: str
    order_url: str
    issuer: str | None = None
    """The CA of the order (None: the first configured)."""


class IssuedCertificate(Frozen):
    serial_hex: str
    not_before: datetime
    not_after: datetime
    ari_window_start: datetime | None = None
    """The CA's first ARI window for it (asked right after the download), so the
    next run sleeps to it without waiting for the renewal-info sweep's signal."""
    ari_window_end: datetime | None = None
    issued_at: datetime | None = None
    """When it was stored (None in histories from before it was kept)."""


class Outcome(Frozen):
    """What a failed attempt does to the row (SPEC §4)."""

    status: CertificateStatus
    retry_count: int
    keep_order: bool
    error_code: ErrorCode


class RecordFailureInput(Frozen):
    certificate_id: str
    outcome: Outcome
    message: str


class RenewalAdvice(Frozen):
    """The CA's ARI suggested window (RFC 9773), when it offers one."""

    window_start: datetime | None = None
    window_end: datetime | None = None
    recheck_after_seconds: float | None = None


class RenewalWindow(Frozen):
    """Argument of the ``renewal_window`` signal: the CA's window for the
    certificate of this serial moved."""

    start: datetime
    end: datetime
    serial: str


class RenewalInfoSweepResult(Frozen):
    """What one renewal-info sweep did."""

    asked: int = 0
    moved: int = 0


class OpenOrder(Frozen):
    """The order a cancel found open (its authorization is then deactivated)."""

    order_url: str | None = None


class DeleteRequest(Frozen):
    """Argument of the ``delete`` signal and update."""

    revoke: bool = False


class Phase(StrEnum):
    """What the Certificate workflow is doing (the ``phase`` of its status)."""

    STARTING = "starting"
    CHECKING_DNS = "checking DNS"
    CHECKING_HTTP01 = "checking the challenge is reachable"
    PUBLISHING_DNS01 = "publishing the dns-01 TXT in our zone"
    CREATING_ORDER = "creating order"
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


class CertificateState(Frozen):
    """What the product sees of a certificate: the answer of the ``status`` query
    and of updates (the workflow's view), and of ``CertflowClient.status`` and
    ``list_certificates`` (the row, joined with the workflow's view when one runs)."""

    hostname: str
    status: CertificateStatus
    phase: Phase | None = None
    """None when no workflow runs (the row alone)."""
    error_code: ErrorCode | None = None
    error_message: str | None = None
    retry_count: int = 0
    next_attempt_at: datetime | None = None
    expires_at: datetime | None = None
    tenant_id: str | None = None
    serial: str | None = None
    workflow_id: str | None = None
    cooldown_until: datetime | None = None
    """When a CA rate limit holds the certificate back, until when."""
    issuer: str | None = None
    """The CA of the current certificate."""
    order_issuer: str | None = None
    """The CA of the attempt under way (differs from ``issuer`` after a fallback)."""
    cooldowns: list[Cooldown] = []
    """The rate-limit cooldowns that hold it back (its own, its registered
    domain's, the account's), longest first."""
    ownership: DnsRecord | None = None
    """The record that proves the row's tenant owns the hostname (shown by the client
    when OWNERSHIP_SECRET is set)."""
    methods: list[MethodReadiness] | None = None
    """For a PENDING certificate, asked with ``status(host, methods=True)``: each
    validation method, ready or not, and the record to add for it (a check run on a
    worker at that moment, as ``check`` runs it)."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (times ISO 8601), as ``status --json`` prints it."""
        return self.model_dump(mode="json")


class CertificateEvent(Frozen):
    """One transition of a certificate (``certificate_events``)."""

    at: datetime
    from_status: str | None
    to_status: str
    error_code: str | None
    message: str | None


CertificateInput.model_rebuild()


class ReconcileInput(Frozen):
    """A reconcile pass; ``full`` also lists every running workflow (the old, O(rows)
    pass: for an operator after the schedule was held for long)."""

    full: bool = False


class PruneEventsResult(Frozen):
    """What one retention pass over ``certificate_events`` did."""

    deleted: int
    examined: int


class ReconcileResult(Frozen):
    """What a reconcile pass did."""

    checked: int
    started: list[str]
    """The hostnames started (the first ``LISTED`` of them: a cold pass over
    100,000 rows would not fit in one Temporal payload)."""
    refused: list[str] = []
    """Rows whose hostname is not valid: CANCELED with INVALID_HOSTNAME, never
    started (the first ``LISTED``)."""
    started_count: int | None = None
    """How many were started; None in results recorded before the lists were capped."""
    refused_count: int | None = None

    LISTED: ClassVar[int] = 100

    @property
    def total_started(self) -> int:
        return len(self.started) if self.started_count is None else self.started_count

    @property
    def total_refused(self) -> int:
        return len(self.refused) if self.refused_count is None else self.refused_count


class WebhookEvent(Frozen):
    """What the product receives for issued, renewed, failed, expiring_soon and canceled."""

    event_id: str
    event: str
    hostname: str
    tenant_id: str | None = None
    status: CertificateStatus
    error_code: ErrorCode | None = None
    error_message: str | None = None
    serial: str | None = None
    expires_at: datetime | None = None
    occurred_at: datetime
    issuer: str | None = None
    """The CA of the certificate (issued, renewed) or of the attempt (failed)."""
    issuer_reason: str | None = None
    """Why that CA rather than the first configured one (CAA, a fallback)."""
