"""In-memory stand-ins for the Certificate workflow's activities.

Every activity the workflow calls by name is replaced by a plain async function
registered under that name, taking and returning the real payload models. The
fakes share one :class:`Row` (the certificate row as Postgres would hold it)
and apply the same guarded transitions the SQL in ``certflow/store/certificates.py``
applies, so the workflow sees what it would see against Postgres: after
``finalize_and_store`` the row is ACTIVE, so the next run's
``ensure_certificate`` answers ACTIVE and the workflow waits for the renewal
time.

Each fake appends a :class:`Call` (name, input, the test server's virtual time)
to ``Fakes.calls``, so tests assert the exact order of side effects and the
durable waits between them. A *behaviour* (``Fakes.behaviours[name]``) gets the
0-based index of the call of that activity and its input; it may raise, return
a value of its own, or return :data:`DEFAULT` to let the fake do what the real
activity does.

About time skipping (V1 / Java test server): the server's clock runs with the
wall clock while time skipping is *locked*, the default. The SDK unlocks it
only while ``handle.result()`` or ``env.sleep()`` is awaited; then the server
jumps to the next timer whenever nothing is in flight. An ACTIVE certificate's
workflow never completes on its own (it waits for the renewal time, renews,
continues as new, …), so tests observe it through the ``status`` query, move
virtual time on with ``env.sleep`` and end with the ``cancel`` update, after
which ``handle.result()`` returns.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from certflow.errors import ErrorCode
from certflow.models import AcmeStatus, RequestedMethod, ValidationMethod
from certflow.models import CertificateRecord, CertificateStatus
from certflow.activity_payloads import (
    OrderAndValidateInput,
    OrderedAndValidated,
    AcceptChallengeInput,
    CheckDnsInput,
    Dns01ChallengeInput,
    GiveUpInput,
    TransferInput,
    Transferred,
    CreateOrderInput,
    DnsVerdict,
    EnsureCertificateInput,
    EnsureCertificateResult,
    FinalizeInput,
    Http01CheckInput,
    IssuedCertificate,
    OpenedOrder,
    OpenOrder,
    OrderProgress,
    Outcome,
    PersistChallengeInput,
    PlaceOrderInput,
    PlacedOrder,
    RecordFailureInput,
    RenewalAdvice,
    Transition,
    ValidateOrderInput,
    WaitForOrderInput,
)
from certflow.workflow_payloads import CertificateInput, CertificateState, ProvisioningPolicy
from certflow.contract import CERTIFICATE_DESIGN, CERTIFICATE_WORKFLOW, workflow_id_for
from activities.obtain import validation_of
from certflow.hostnames import Hostname, as_hostname
from workflows.certificate import CertificateWorkflow
from tests import expected

HOSTNAME = as_hostname("x.test")
CERT_ID = "11111111-2222-3333-4444-555555555555"

# Fast defaults: a test that measures a wait sets the knob it measures.
FAST_POLICY = ProvisioningPolicy(
    dns_recheck_initial_seconds=60,
    dns_recheck_max_seconds=3600,
    failure_backoff_initial_seconds=60,
    failure_backoff_max_seconds=3600,
    order_fast_poll_seconds=1,
    failed_retry_seconds=0,
    max_failures=3,
)

HAPPY_STEPS = [
    "ensure_certificate",
    "check_dns",
    "place_order",  # creates the order and persists its challenge
    "check_http01",  # fetches the challenge as the CA will
    "wait_for_order",  # accepts the challenge first, then polls
    "finalize_and_store",
]
# What a run that starts on an ACTIVE row does before it waits for the renewal time.
# (The renewal-info sweep asks the CA's ARI, not each certificate's workflow.)
ACTIVE_RUN_STEPS = ["ensure_certificate"]
# What the run after an issuance does before it waits: nothing (it starts from the
# row the issuing run stored, carried over the continue-as-new).
AFTER_ISSUANCE_STEPS: list[str] = []
# An issuance or renewal from a clean row (no open order), after ensure/begin_renewal.
ATTEMPT_STEPS = HAPPY_STEPS[1:]

DEFAULT: Any = object()
"""A behaviour returns this to let the fake do what the real activity does."""


def order(n: int) -> OpenedOrder:
    return OpenedOrder(
        order_url=f"https://ca.test/order/{n}",
        authorization_url=f"https://ca.test/authz/{n}",
        challenge_url=f"https://ca.test/chall/{n}",
        token=f"tok-{n}",
        key_authorization=f"tok-{n}.thumbprint",
    )


def app_error(
    code: ErrorCode,
    message: str,
    *,
    retry_after: float | None = None,
    non_retryable: bool = True,
) -> ApplicationError:
    """The error a real activity raises (see ``certflow.errors.to_application_error``).

    non_retryable by default so the activity retry policy does not replay it:
    every raise is then one failed attempt as the workflow sees it.
    """
    details: dict[str, Any] = {"code": str(code), "message": message}
    if retry_after is not None:
        details["retry_after_seconds"] = retry_after
    return ApplicationError(message, details, type=str(code), non_retryable=non_retryable)


def dns_cname_error() -> ApplicationError:
    return app_error(ErrorCode.DNS_CNAME, f"{HOSTNAME} has no CNAME to edge.test")


def dns_caa_error() -> ApplicationError:
    return app_error(ErrorCode.DNS_CAA, f"CAA of {HOSTNAME} does not allow ca.test")


def acme_temporary_error() -> ApplicationError:
    return app_error(ErrorCode.ACME_TEMPORARY, "the CA answered 503")


def invalid_order_error() -> ApplicationError:
    return app_error(ErrorCode.ACME_INVALID_ORDER, "the order is invalid")


def rate_limited_error(retry_after: float) -> ApplicationError:
    return app_error(
        ErrorCode.ACME_RATE_LIMITED, "too many new orders recently", retry_after=retry_after
    )


@dataclass
class Row:
    """The certificate row (the fakes' Postgres)."""

    certificate_id: str = CERT_ID
    hostname: Hostname = HOSTNAME
    tenant_id: str | None = None
    status: CertificateStatus = CertificateStatus.PENDING
    error_code: ErrorCode | None = None
    error_message: str | None = None
    retry_count: int = 0
    order_url: str | None = None
    challenge_url: str | None = None
    not_before: datetime | None = None
    expires_at: datetime | None = None
    skips_dns: bool = False
    ari_window: tuple[datetime, datetime] | None = None
    """The CA's window as the renewal-info sweep stored it."""
    serial: str | None = None
    deleted: bool = False
    issuer: str | None = None
    order_issuer: str | None = None
    issued_at: datetime | None = None
    validation_method: ValidationMethod | None = None
    requested_method: RequestedMethod = RequestedMethod.AUTO
    dns01_txt: str | None = None
    """The TXT publish_dns01 wrote in our zone for this hostname (None: none there)."""

    def record(self) -> CertificateRecord:
        return CertificateRecord(
            certificate_id=self.certificate_id,
            hostname=self.hostname,
            tenant_id=self.tenant_id,
            status=self.status,
            error_code=self.error_code,
            error_message=self.error_message,
            retry_count=self.retry_count,
            order_url=self.order_url,
            challenge_url=self.challenge_url,
            not_before=self.not_before,
            expires_at=self.expires_at,
            skips_dns=self.skips_dns,
            serial=self.serial,
            ari_window_start=self.ari_window[0] if self.ari_window else None,
            ari_window_end=self.ari_window[1] if self.ari_window else None,
            issuer=self.issuer,
            order_issuer=self.order_issuer,
            issued_at=self.issued_at,
            validation_method=self.validation_method,
            requested_method=self.requested_method,
        )

    def clear_order(self) -> None:
        # As the SQL: validation_method stays, the method of the last attempt.
        self.order_url = self.challenge_url = None


def renewal_at(
    not_before: datetime, not_after: datetime, window: tuple[datetime, datetime] | None = None
) -> datetime:
    """When the workflow renews the fakes' certificate (its spread is per certificate),
    computed from docs/lifecycle.md's rule (tests/expected.py), not by the product."""
    return expected.renewal_time(HOSTNAME, not_before, not_after, window)


def active_row(not_before: datetime, lifetime: timedelta, serial: str = "initial") -> Row:
    return Row(
        status=CertificateStatus.ACTIVE,
        not_before=not_before,
        expires_at=not_before + lifetime,
        serial=serial,
    )


@dataclass
class Call:
    name: str
    arg: Any
    at: datetime  # the test server's (virtual) clock when the activity ran


Behaviour = Callable[[int, Any], Awaitable[Any]]


def fail_first(times: int, error: Callable[[], BaseException]) -> Behaviour:
    """Raise error() on the first `times` calls, then behave like the real activity."""

    async def behaviour(index: int, _: Any) -> Any:
        if index < times:
            raise error()
        return DEFAULT

    return behaviour


def returns(*values: Any) -> Behaviour:
    """The i-th call returns values[i] (DEFAULT past the end)."""

    async def behaviour(index: int, _: Any) -> Any:
        return values[index] if index < len(values) else DEFAULT

    return behaviour


@dataclass
class Fakes:
    env: WorkflowEnvironment
    row: Row = field(default_factory=Row)
    policy: ProvisioningPolicy = FAST_POLICY
    lifetime: timedelta = timedelta(days=90)
    first_window: tuple[timedelta, timedelta] | None = None
    """The ARI window finalize_and_store gets for a new certificate (offsets from
    its notBefore); None: the CA had no answer."""
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    issued: list[IssuedCertificate] = field(default_factory=list)
    orders_created: int = 0
    cooldown_until: datetime | None = None
    """The CA's shared rate-limit cooldown (``acme_cooldowns``)."""

    def rate_limited(self, times: int, seconds: float) -> Behaviour:
        """The first `times` calls hit a CA rate limit with Retry-After `seconds`:
        like the real activities, extend the shared cooldown, then raise."""

        async def behaviour(index: int, _: Any) -> Any:
            if index >= times:
                return DEFAULT
            until = self.calls[-1].at + timedelta(seconds=seconds)
            if self.cooldown_until is None or until > self.cooldown_until:
                self.cooldown_until = until
            raise rate_limited_error(seconds)

        return behaviour

    # -- reading what happened ------------------------------------------------

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def of(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def outcomes(self) -> list[Outcome]:
        return [c.arg.outcome for c in self.of("record_failure")]

    def names_after(self, index: int) -> list[str]:
        return self.names()[index:]

    # -- the fakes ------------------------------------------------------------

    async def _enter(self, name: str, arg: Any) -> tuple[Any, datetime]:
        index = len(self.of(name))
        now = await self.env.get_current_time()
        self.calls.append(Call(name, arg, now))
        behaviour = self.behaviours.get(name)
        result = DEFAULT if behaviour is None else await behaviour(index, arg)
        return result, now

    def _gone(self) -> ApplicationError:
        return ApplicationError(
            f"certificate {self.row.certificate_id} no longer exists",
            type="CERTIFICATE_GONE",
            non_retryable=True,
        )

    def activities(self) -> list[Callable[..., Any]]:
        row = self.row

        @activity.defn(name="ensure_certificate")
        async def ensure_certificate(input: EnsureCertificateInput) -> EnsureCertificateResult:
            result, _ = await self._enter("ensure_certificate", input)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            if row.deleted:  # INSERT … ON CONFLICT DO NOTHING: a fresh PENDING row
                fresh = Row(hostname=input.hostname, tenant_id=input.tenant_id)
                row.__dict__.update(fresh.__dict__)
            return EnsureCertificateResult(record=row.record(), policy=self.policy)

        @activity.defn(name="check_dns")
        async def check_dns(input: CheckDnsInput) -> DnsVerdict:
            result, _ = await self._enter("check_dns", input)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            return DnsVerdict(allowed_issuers=self.policy.issuers)  # what CAA allows: every one

        @activity.defn(name="check_http01")
        async def check_http01(input: Http01CheckInput) -> None:
            await self._enter("check_http01", input)

        @activity.defn(name="publish_dns01")
        async def publish_dns01(input: Dns01ChallengeInput) -> None:
            result, _ = await self._enter("publish_dns01", input)
            if result is DEFAULT:
                row.dns01_txt = f"txt-of-{row.order_url}"

        @activity.defn(name="give_up")
        async def give_up(input: GiveUpInput) -> Transition:
            result, _ = await self._enter("give_up", input)
            if result is not DEFAULT:
                return Transition.model_validate(result)
            allowed = (
                (CertificateStatus.PENDING, CertificateStatus.PROVISIONING)
                if input.status is CertificateStatus.CANCELED
                else (CertificateStatus.EXPIRED,)
            )
            if row.deleted or row.status not in allowed:
                return Transition(applied=False)
            row.status, row.error_code, row.error_message = input.status, input.code, input.message
            row.clear_order()
            return Transition(applied=True, row=row.record())

        @activity.defn(name="transfer_certificate")
        async def transfer_certificate(input: TransferInput) -> Transferred:
            result, _ = await self._enter("transfer_certificate", input)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            before = row.tenant_id
            row.tenant_id = input.to_tenant
            return Transferred(record=row.record(), from_tenant=before)

        @activity.defn(name="withdraw_dns01")
        async def withdraw_dns01(input: Dns01ChallengeInput) -> None:
            result, _ = await self._enter("withdraw_dns01", input)
            if result is DEFAULT:
                row.dns01_txt = None

        @activity.defn(name="place_order")
        async def place_order(input: PlaceOrderInput) -> OpenedOrder:
            # The row as the real one's persist returns it, with the order it placed.
            def placed(opened: OpenedOrder) -> PlacedOrder:
                return PlacedOrder(**opened.model_dump(), row=row.record())

            if input.issuer is not None and row.order_url is None:
                row.order_issuer = input.issuer  # recorded before anything is sent
            result, _ = await self._enter("place_order", input)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            # As the real one: only a retry resumes an order on the row (an earlier
            # try's); a first try's order is refused by persist_challenge's guard
            # when the row holds another.
            if activity.info().attempt > 1 and row.order_url is not None and not row.deleted:
                return placed(order(int(row.order_url.rsplit("/", 1)[1])))
            self.orders_created += 1
            method = input.methods[0] if input.methods else None
            opened = order(self.orders_created).model_copy(update={"method": method})
            fresh = row.status in (
                CertificateStatus.PENDING,
                CertificateStatus.RENEWING,
                CertificateStatus.EXPIRED,
            )
            if row.deleted or not fresh or row.order_url is not None:
                raise app_error(ErrorCode.ACME_INVALID_ORDER, "the certificate row moved on")
            if row.status not in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED):
                row.status = CertificateStatus.PROVISIONING
            row.order_url = opened.order_url
            row.challenge_url = opened.challenge_url
            row.validation_method = method
            row.error_code = row.error_message = None
            return placed(opened)

        @activity.defn(name="create_order")
        async def create_order(input: CreateOrderInput) -> OpenedOrder:
            result, _ = await self._enter("create_order", input)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            self.orders_created += 1
            return order(self.orders_created)

        @activity.defn(name="persist_challenge")
        async def persist_challenge(input: PersistChallengeInput) -> bool:
            result, _ = await self._enter("persist_challenge", input)
            if result is not DEFAULT:
                return bool(result)
            fresh = row.status in (
                CertificateStatus.PENDING,
                CertificateStatus.RENEWING,
                CertificateStatus.EXPIRED,
            )
            if row.deleted or not (
                (fresh and row.order_url is None) or row.order_url == input.order.order_url
            ):
                return False
            if row.status not in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED):
                row.status = CertificateStatus.PROVISIONING
            row.order_url = input.order.order_url
            row.challenge_url = input.order.challenge_url
            row.error_code = row.error_message = None
            return True

        @activity.defn(name="accept_challenge")
        async def accept_challenge(input: AcceptChallengeInput) -> None:
            await self._enter("accept_challenge", input)

        @activity.defn(name="wait_for_order")
        async def wait_for_order(input: WaitForOrderInput) -> OrderProgress:
            result, _ = await self._enter("wait_for_order", input)
            return OrderProgress(status=AcmeStatus.READY) if result is DEFAULT else result

        @activity.defn(name="validate_order")
        async def validate_order(input: ValidateOrderInput) -> OrderProgress:
            # The real one runs check_http01's and wait_for_order's work in one
            # activity: recorded as those two calls, with their behaviours.
            if input.self_check:
                await check_http01(
                    Http01CheckInput(certificate_id=input.certificate_id, hostname=input.hostname)
                )
            return await wait_for_order(input.wait)

        @activity.defn(name="order_and_validate")
        async def order_and_validate(input: OrderAndValidateInput) -> OrderedAndValidated:
            # The real one runs place_order's and validate_order's work in one
            # activity: recorded as those calls, with their behaviours.
            opened = await place_order(input.order)
            placed = opened if isinstance(opened, PlacedOrder) else PlacedOrder(**opened.model_dump())
            validation = validation_of(input, placed)
            if validation is None:
                return OrderedAndValidated(order=placed)
            return OrderedAndValidated(order=placed, progress=await validate_order(validation))

        @activity.defn(name="finalize_and_store")
        async def finalize_and_store(input: FinalizeInput) -> IssuedCertificate:
            result, now = await self._enter("finalize_and_store", input)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            if row.deleted or row.order_url != input.order_url or row.status not in (
                CertificateStatus.PROVISIONING,
                CertificateStatus.RENEWING,
                CertificateStatus.PENDING,
                CertificateStatus.EXPIRED,
            ):
                raise app_error(
                    ErrorCode.ACME_INVALID_ORDER,
                    "the certificate row moved on before the certificate could be stored",
                )
            window = None
            if self.first_window is not None:
                window = (now + self.first_window[0], now + self.first_window[1])
            issued = IssuedCertificate(
                serial_hex=f"{len(self.issued) + 1:04x}",
                not_before=now,
                not_after=now + self.lifetime,
                ari_window_start=window[0] if window else None,
                ari_window_end=window[1] if window else None,
                issued_at=now,
            )
            self.issued.append(issued)
            row.issued_at = now
            row.status = CertificateStatus.ACTIVE
            row.serial = issued.serial_hex
            row.not_before, row.expires_at = issued.not_before, issued.not_after
            row.retry_count = 0
            row.error_code = row.error_message = None
            row.ari_window = window  # without one, the sweep's to find
            row.issuer = row.order_issuer
            row.clear_order()
            return issued.model_copy(update={"row": row.record()})

        @activity.defn(name="record_failure")
        async def record_failure(input: RecordFailureInput) -> Transition:
            result, _ = await self._enter("record_failure", input)
            if result is not DEFAULT:
                return Transition.model_validate(result)
            if row.deleted or row.status in (CertificateStatus.ACTIVE, CertificateStatus.CANCELED):
                return Transition(applied=False)
            outcome = input.outcome
            row.status = outcome.status
            row.retry_count = outcome.retry_count
            row.error_code = outcome.error_code
            row.error_message = input.message[:2000]  # as the column keeps it
            if not outcome.keep_order:
                row.clear_order()
            return Transition(applied=True, row=row.record())

        @activity.defn(name="reopen_failed")
        async def reopen_failed(certificate_id: str) -> CertificateRecord:
            result, now = await self._enter("reopen_failed", certificate_id)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            if row.deleted:
                raise self._gone()
            if row.status is CertificateStatus.FAILED:
                if row.serial is None:
                    row.status = CertificateStatus.PENDING
                elif row.expires_at is not None and row.expires_at <= now:
                    row.status = CertificateStatus.EXPIRED
                else:
                    row.status = CertificateStatus.RENEWING
                row.retry_count = 0
            return row.record()

        @activity.defn(name="load_certificate")
        async def load_certificate(certificate_id: str) -> CertificateRecord:
            result, _ = await self._enter("load_certificate", certificate_id)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            if row.deleted:
                raise self._gone()
            return row.record()

        @activity.defn(name="begin_renewal")
        async def begin_renewal(certificate_id: str) -> Transition:
            result, _ = await self._enter("begin_renewal", certificate_id)
            if result is not DEFAULT:
                return Transition.model_validate(result)
            if row.deleted or row.status is not CertificateStatus.ACTIVE:
                return Transition(applied=False)
            row.status = CertificateStatus.RENEWING
            return Transition(applied=True, row=row.record())

        @activity.defn(name="mark_expired")
        async def mark_expired(certificate_id: str) -> Transition:
            result, now = await self._enter("mark_expired", certificate_id)
            if result is not DEFAULT:
                return Transition.model_validate(result)
            if (
                row.deleted
                or row.status is not CertificateStatus.RENEWING
                or row.expires_at is None
                or row.expires_at > now
            ):
                return Transition(applied=False)
            row.status = CertificateStatus.EXPIRED
            return Transition(applied=True, row=row.record())

        @activity.defn(name="renewal_info")
        async def renewal_info(certificate_id: str) -> RenewalAdvice:
            result, _ = await self._enter("renewal_info", certificate_id)
            return RenewalAdvice() if result is DEFAULT else result

        @activity.defn(name="cooldown_remaining")
        async def cooldown_remaining(hostname: str) -> float:
            result, now = await self._enter("cooldown_remaining", hostname)
            if result is not DEFAULT:
                return float(result)
            if self.cooldown_until is None:
                return 0.0
            return max(0.0, (self.cooldown_until - now).total_seconds())

        @activity.defn(name="cancel_certificate")
        async def cancel_certificate(certificate_id: str) -> OpenOrder:
            result, _ = await self._enter("cancel_certificate", certificate_id)
            if result is not DEFAULT:
                return result  # type: ignore[no-any-return]
            if row.deleted:  # the SQL finds no row: no order to report, nothing updated
                return OpenOrder()
            order_url = row.order_url
            row.status = CertificateStatus.CANCELED
            row.clear_order()
            return OpenOrder(order_url=order_url, row=row.record())

        @activity.defn(name="deactivate_authorizations")
        async def deactivate_authorizations(order_url: str) -> None:
            await self._enter("deactivate_authorizations", order_url)

        @activity.defn(name="revoke_certificate")
        async def revoke_certificate(certificate_id: str) -> None:
            await self._enter("revoke_certificate", certificate_id)

        @activity.defn(name="delete_certificate")
        async def delete_certificate(certificate_id: str) -> bool:
            result, _ = await self._enter("delete_certificate", certificate_id)
            if result is not DEFAULT:
                return bool(result)
            existed = not row.deleted
            row.deleted = True
            return existed

        return [
            ensure_certificate,
            check_dns,
            check_http01,
            publish_dns01,
            withdraw_dns01,
            transfer_certificate,
            give_up,
            place_order,
            create_order,
            persist_challenge,
            accept_challenge,
            wait_for_order,
            validate_order,
            order_and_validate,
            finalize_and_store,
            record_failure,
            reopen_failed,
            load_certificate,
            begin_renewal,
            mark_expired,
            renewal_info,
            cooldown_remaining,
            cancel_certificate,
            deactivate_authorizations,
            revoke_certificate,
            delete_certificate,
        ]


# -- driving the workflow ---------------------------------------------------------


@dataclass
class Run:
    """A started workflow, its fakes and the environment it runs in."""

    env: WorkflowEnvironment
    fakes: Fakes
    handle: WorkflowHandle[Any, CertificateState]

    async def state(self) -> CertificateState:
        """The status query.

        The V1 test server can lose a query that reaches a run in the very
        workflow task that continues it as new (the worker's answer comes back
        "workflow execution already completed" and the query would hang until
        its deadline), so each try gets a short deadline and is repeated. The
        client reports that deadline as DEADLINE_EXCEEDED or, from the SDK's core,
        as CANCELLED "Timeout expired" (seen in a CI run): both are retried.
        """
        for _ in range(10):
            try:
                state: CertificateState = await self.handle.query(
                    "status", result_type=CertificateState, rpc_timeout=timedelta(seconds=2)
                )
                return state
            except RPCError as err:
                if err.status not in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
                    raise
        pytest.fail("the status query never answered")

    async def signal(self, name: str, arg: Any = None) -> None:
        """Signal the latest run. The V1 test server answers "Completed workflow"
        (NOT_FOUND) to a signal that meets the moment a run continues as new, before
        the next run exists: sent again once that run is there."""
        for _ in range(50):
            try:
                if arg is None:
                    await self.handle.signal(name)
                else:
                    await self.handle.signal(name, arg)
                return
            except RPCError as err:
                if err.status is not RPCStatusCode.NOT_FOUND:
                    raise
                await asyncio.sleep(0.02)
        pytest.fail(f"the {name} signal found no running run")

    async def now(self) -> datetime:
        return await self.env.get_current_time()

    async def until(
        self,
        predicate: Callable[[CertificateState], bool],
        what: str,
        *,
        advance: float | timedelta | None = None,
        timeout: float = 60,
    ) -> CertificateState:
        """Poll the status query until predicate holds.

        Without ``advance`` the clock stays locked (virtual time runs with the
        wall clock, so a long durable wait cannot elapse meanwhile); with it,
        virtual time is skipped by that much between polls.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        state: CertificateState | None = None
        while loop.time() < deadline:
            state = await self.state()
            if predicate(state):
                return state
            if advance is None:
                await asyncio.sleep(0.02)
            else:
                await self.env.sleep(advance)
        pytest.fail(f"workflow never reached {what}; last status: {state!r}; calls: {self.fakes.names()}")

    async def until_workflow_task_failed(self, timeout: float = 60) -> str:
        """Wait until a workflow task of the run failed; its failure's message."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            async for event in self.handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    return event.workflow_task_failed_event_attributes.failure.message
            await asyncio.sleep(0.05)
        pytest.fail("no workflow task failed")

    async def until_calls(
        self,
        name: str,
        count: int,
        *,
        advance: float | timedelta | None = None,
        timeout: float = 60,
    ) -> list[Call]:
        """Wait until `name` was called `count` times (skipping `advance` between checks)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.fakes.of(name)) < count:
            if loop.time() >= deadline:
                pytest.fail(f"{name} called {len(self.fakes.of(name))} times, not {count}: {self.fakes.names()}")
            if advance is None:
                await asyncio.sleep(0.02)
            else:
                await self.env.sleep(advance)
        return self.fakes.of(name)

    async def sleep_until(self, when: datetime) -> None:
        """Skip virtual time up to `when` (no-op when already past)."""
        now = await self.now()
        if when > now:
            await self.env.sleep(when - now)

    async def in_renewal_wait(self, serial_count: int | None = None) -> bool:
        """The row is ACTIVE and the current run is on its renewal timer: its last
        step read the row (runs from before the renewal-info sweep asked the CA when
        to renew last), or — the run after an issuance, which reads nothing — the
        latest run has started a timer since it last scheduled an activity (the run
        itself, kept after the issuance, or the run it continued as new)."""
        names = self.fakes.names()
        if self.fakes.row.status is not CertificateStatus.ACTIVE or not names:
            return False
        if serial_count is not None and len(self.fakes.issued) != serial_count:
            return False
        if names[-1] in ("ensure_certificate", "load_certificate", "renewal_info"):
            return True
        if names[-1] not in ("finalize_and_store", "withdraw_dns01"):
            return False
        latest = await self.env.client.get_workflow_handle(self.handle.id).describe()
        if latest.status is not WorkflowExecutionStatus.RUNNING:
            return False
        history = await self.env.client.get_workflow_handle(
            self.handle.id, run_id=latest.run_id
        ).fetch_history()
        kinds = [event.event_type for event in history.events]

        def last(kind: EventType.ValueType) -> int:
            return max((i for i, k in enumerate(kinds) if k == kind), default=-1)

        return last(EventType.EVENT_TYPE_TIMER_STARTED) > last(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)

    async def until_active(
        self,
        *,
        serial_count: int | None = None,
        advance: float | timedelta | None = None,
        timeout: float = 60,
    ) -> CertificateState:
        """Wait for ACTIVE on the renewal timer (optionally after `serial_count` issuances).

        Waits on the fakes first and only then queries: the V1 test server can
        lose a query that meets the workflow task that continues the run as new,
        and then also never records that run's close event (``handle.result()``
        and history reads of that run hang). After the new run read the row it is
        on its timer and queries are safe.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await self.in_renewal_wait(serial_count):
            if loop.time() >= deadline:
                pytest.fail(
                    f"never reached the renewal wait; row {self.fakes.row!r}; "
                    f"calls: {self.fakes.names()}"
                )
            if advance is None:
                await asyncio.sleep(0.02)
            else:
                await self.env.sleep(advance)
        return await self.until(
            lambda s: s.status is CertificateStatus.ACTIVE
            and s.phase == "active; waiting for the renewal time",
            "ACTIVE (waiting for the renewal time)",
        )

    async def cancel(self) -> CertificateState:
        """End the workflow with the cancel update; returns the workflow's result."""
        answer = await self.handle.execute_update("cancel", result_type=CertificateState)
        assert answer.status is CertificateStatus.CANCELED, answer
        result = await self.result()
        assert result.status is CertificateStatus.CANCELED, result
        return result

    async def result(self) -> CertificateState:
        """The result of a workflow that is ending (after cancel or delete).

        Awaited with time skipping left locked: unlocked, the V1 test server
        would jump its clock to the next timer it still holds, including the
        10-year run-timeout timers of earlier tests' closed runs.
        """
        latest = self.env.client.get_workflow_handle(
            self.handle.id, result_type=CertificateState
        )  # the current run: following the chain from the first run is not needed
        with self.env.auto_time_skipping_disabled():
            return await asyncio.wait_for(latest.result(), 20)

    async def run_id(self) -> str:
        run_id = (await self.handle.describe()).run_id
        assert run_id is not None
        return run_id


def _with_design(input: CertificateInput, design: int | None) -> CertificateInput:
    return input if input.design is not None else input.model_copy(update={"design": design})


@asynccontextmanager
async def started(
    env: WorkflowEnvironment,
    fakes: Fakes,
    input: CertificateInput | None = None,
    design: int | None = CERTIFICATE_DESIGN,
    task_timeout: timedelta | None = None,
) -> AsyncIterator[Run]:
    """A worker with the fakes on a fresh task queue, and the workflow started on it,
    of ``design`` (as certflow starts it) unless the input names one (None: decided
    by the workflow's first run, as for a start by other code). ``task_timeout``:
    the workflow task's (10 s by default; a local activity that outlasts 80 % of
    it is heartbeated by a new workflow task, in real time).

    A workflow still running when the test ends (a failed test) is terminated,
    so it cannot wake up during a later test's time skipping.
    """
    task_queue = f"certificate-test-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[CertificateWorkflow],
        activities=fakes.activities(),
    ):
        handle: WorkflowHandle[Any, CertificateState] = await env.client.start_workflow(
            CERTIFICATE_WORKFLOW,
            _with_design(input or CertificateInput(hostname=HOSTNAME), design),
            id=f"{workflow_id_for(HOSTNAME)}:{uuid.uuid4()}",
            task_queue=task_queue,
            result_type=CertificateState,
            task_timeout=task_timeout,
            # No execution timeout: the V1 test server keeps a run's timeout timer
            # after the run continued as new, and the next unlocked wait would
            # jump virtual time to it. A failed test's run is terminated below.
        )
        try:
            yield Run(env, fakes, handle)
        finally:
            try:
                if (await handle.describe()).status is WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("test over")
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass


def seconds_between(calls: list[Call]) -> list[float]:
    return [(b.at - a.at).total_seconds() for a, b in zip(calls, calls[1:])]


def gap(a: Call, b: Call) -> float:
    return (b.at - a.at).total_seconds()
