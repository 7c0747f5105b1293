"""What clients and workflows exchange: the Certificate workflow's input (and what
it carries across continue-as-new), its ``status`` answer and the arguments of its
signals and updates, and the other workflows' inputs and results (domain check,
reconcile, renewal-info sweep, webhook delivery).

The shared vocabulary is in ``models``; what the workflows exchange with their
activities, in ``activity_payloads``. These shapes are in recorded histories
(tests/workflows/histories), as JSON.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from certflow.errors import ErrorCode
from certflow.hostnames import Hostname
from certflow.models import (
    CertificateRecord,
    CertificateStatus,
    Cooldown,
    DnsRecord,
    Frozen,
    MethodReadiness,
    Phase,
    RequestedMethod,
)


class CertificateInput(Frozen):
    """Input of the Certificate workflow (the product backend's contract:
    ``hostname`` and optional ``tenant_id``)."""

    hostname: Hostname
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
    design: int | None = None
    """Set by certflow itself, at its starts (certflow/product/starts.py) and on
    continue-as-new: the design the workflow's runs follow (workflows/patches.py);
    None: decided by the first run (a start by other code)."""
    requested: CertificateRecord | None = None
    """Set by certflow's ``request`` only: the row it has just written, which the
    first run takes instead of reading it (``ensure_certificate``)."""


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
    renew_requested: bool = False
    """A renewal was asked for (a ``renew`` signal, a transfer) that the run had not
    started when it handed over: the next run renews at once."""


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
    hostname_search_attribute: bool = True
    """Whether they show the hostname (CERTFLOW_HOSTNAME_SEARCH_ATTRIBUTE)."""
    http01_self_check: bool = True
    """Fetch the challenge as the CA would before accepting it (docs/lifecycle.md, "Before the CA is asked")."""
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


class TransferRequest(Frozen):
    """The ``transfer`` update: move the hostname to another tenant, once that tenant
    has proven ownership (its ``_certflow`` TXT)."""

    to_tenant: str


class DomainCheckInput(Frozen):
    hostname: Hostname
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

    hostname: Hostname
    checks: list[DomainCheck]
    methods: list[MethodReadiness] = []
    """Each validation method: ready or not, and the record to add for it."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


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


class DeleteRequest(Frozen):
    """Argument of the ``delete`` signal and update."""

    revoke: bool = False


class CertificateState(Frozen):
    """What the product sees of a certificate: the answer of the ``status`` query
    and of updates (the workflow's view), and of ``CertflowClient.status`` and
    ``list_certificates`` (the row, joined with the workflow's view when one runs)."""

    hostname: Hostname
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
    design: int | None = None
    """The workflow design the run follows (docs/changing-the-workflow.md, "Retiring an
    old design"); None without a run, or from a worker of a release before it was
    shown."""
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


CertificateInput.model_rebuild()


class ReconcileInput(Frozen):
    """A reconcile pass; ``full`` also lists every running workflow (the old, O(rows)
    pass: for an operator after the schedule was held for long)."""

    full: bool = False


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
    """What the product receives for issued, renewed, failed, expiring_soon,
    canceled, transferred, abandoned, departed and not_ready."""

    event_id: str
    event: str
    hostname: Hostname
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
    methods: list[MethodReadiness] | None = None
    """For ``not_ready``: each validation method, ready or not, and the record the
    customer adds for it, as ``check`` finds them when the webhook is sent (the
    delivery fills it in; the workflow's event never carries it)."""
