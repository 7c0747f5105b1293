"""What the workflows and their activities exchange: each activity's input and
result — the row's transitions, the checks before an order, the order's steps at
the CA, renewal info, retention.

The shared vocabulary is in ``models``; what clients and workflows exchange, in
``workflow_payloads``. These shapes are in recorded histories
(tests/workflows/histories), as JSON. Nothing here ever holds key material: the
key authorization is public by design.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import model_validator

from certflow.errors import ErrorCode
from certflow.hostnames import Hostname
from certflow.models import (
    AcmeStatus,
    CertificateRecord,
    CertificateStatus,
    Frozen,
    OrderKind,
    RequestedMethod,
    ValidationMethod,
)
from certflow.workflow_payloads import ProvisioningPolicy


class Transition(Frozen):
    """A guarded transition's answer: whether it applied and, when it did, the row as
    it left it (``RETURNING``), which the workflow takes as its record."""

    applied: bool
    row: CertificateRecord | None = None
    """None also in histories from before transitions returned their row."""

    @model_validator(mode="before")
    @classmethod
    def _from_bare_answer(cls, value: Any) -> Any:
        # Those histories hold the bare true or false the transition used to return.
        return {"applied": value} if isinstance(value, bool) else value


class GiveUpInput(Frozen):
    """Stop trying for a hostname: CANCELED (ABANDONED) or EXPIRED (DEPARTED)."""

    certificate_id: str
    status: CertificateStatus
    code: ErrorCode
    message: str


class EnsureCertificateInput(Frozen):
    hostname: Hostname
    tenant_id: str | None = None
    method: RequestedMethod | None = None
    """The validation method a backend's workflow input asked for (None: the row's)."""
    requested: CertificateRecord | None = None
    """The row a request has just written (CertificateInput.requested)."""


class EnsureCertificateResult(Frozen):
    record: CertificateRecord
    policy: ProvisioningPolicy


class RowRequest(Frozen):
    """What the row asks for: a validation method, for a tenant."""

    requested_method: RequestedMethod
    tenant_id: str | None


class CheckDnsInput(Frozen):
    hostname: Hostname
    method: RequestedMethod | None = None
    """The method to check for (None: the one the row asks for)."""
    row: RowRequest | None = None
    """The row's method and tenant as the workflow read them in the same workflow
    task (None: read them now; a request or a transfer may have changed them)."""


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
    hostname: Hostname


class PlaceOrderInput(Frozen):
    certificate_id: str
    hostname: Hostname
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
    authorized: bool = False
    """The CA reused an authorization already valid: nothing to answer, check or
    publish; the order is ready."""


class PlacedOrder(OpenedOrder):
    """An order place_order opened and persisted, with the row as persisting it left
    it (None in histories from before transitions returned their row)."""

    row: CertificateRecord | None = None


class Http01CheckInput(Frozen):
    """The self-check of the challenge persisted for this certificate (before accept)."""

    certificate_id: str
    hostname: Hostname
    token: str | None = None
    key_authorization: str | None = None
    """The challenge as persisted by this attempt's place_order (None: read the row)."""


class TransferInput(Frozen):
    certificate_id: str
    hostname: Hostname
    to_tenant: str


class Transferred(Frozen):
    """The row after a transfer, and the tenant it had."""

    record: CertificateRecord
    from_tenant: str | None


class Dns01ChallengeInput(Frozen):
    """The dns-01 challenge persisted for this certificate: its TXT to publish in our
    zone (before accept), or to withdraw (after the order)."""

    certificate_id: str
    hostname: Hostname


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
    hostname: Hostname
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
    row: CertificateRecord | None = None
    """The row as storing it left it (None in histories from before transitions
    returned their row)."""


class ValidateOrderInput(Frozen):
    """The order's validation in one activity: the self-check of the challenge, then
    the accept and the fast poll."""

    wait: WaitForOrderInput
    certificate_id: str
    hostname: Hostname
    self_check: bool = False
    """Fetch the persisted challenge as the CA will before accepting it."""
    token: str | None = None
    key_authorization: str | None = None
    """The challenge as persisted by this attempt's place_order (None: read the row)."""


class OrderAndValidateInput(Frozen):
    """A new order placed and validated in one activity (workflows of the
    order-in-one-step design): place_order's work, then validate_order's."""

    order: PlaceOrderInput
    within_seconds: float
    """How long to poll the order fast once its challenge is accepted."""
    self_check: bool = True
    """Fetch an http-01 challenge as the CA will before accepting it."""


class OrderedAndValidated(Frozen):
    """The order as placed and persisted, and how far its validation got: None when
    its challenge is dns-01, whose TXT the workflow publishes before the accept."""

    order: PlacedOrder
    progress: OrderProgress | None = None


class Outcome(Frozen):
    """What a failed attempt does to the row (docs/lifecycle.md, "Statuses and errors")."""

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


class OpenOrder(Frozen):
    """The order a cancel found open (its authorization is then deactivated)."""

    order_url: str | None = None
    row: CertificateRecord | None = None
    """The row as the cancel left it (None when it was gone, and in histories from
    before transitions returned their row)."""


class PruneEventsResult(Frozen):
    """What one retention pass over ``certificate_events`` did."""

    deleted: int
    examined: int
