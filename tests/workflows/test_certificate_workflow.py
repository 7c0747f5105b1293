"""The Certificate workflow on Temporal's time-skipping test server.

Every activity is replaced by a fake registered under the real activity's name
with the same input/output models. Each fake appends a :class:`Call` (name,
input, virtual time of the call) to one shared list, so tests can assert the
exact order of side effects and the durable waits between them.

About time skipping (V1 / Java test server): the server's clock runs with the
wall clock while time skipping is *locked*, which is the default. The SDK
unlocks it only while ``handle.result()`` is awaited (and during
``env.sleep``): then the server jumps straight to the next timer whenever
nothing else is in flight. So a test that has to act *during* a long durable
wait polls the ``status`` query first (the clock is locked: the wait cannot
elapse under its feet), acts, and only then awaits the result.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar, cast

import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from certflow.errors import ErrorCode
from certflow.models import (
    WORKFLOW_TYPE,
    AcceptChallengeInput,
    CertificateInput,
    CertificateRecord,
    CertificateState,
    CertificateStatus,
    CheckDnsInput,
    CreateOrderInput,
    EnsureCertificateInput,
    EnsureCertificateResult,
    FinalizeInput,
    IssuedCertificate,
    OpenedOrder,
    OrderProgress,
    PersistChallengeInput,
    ProvisioningPolicy,
    RecordFailureInput,
    WaitForOrderInput,
    workflow_id_for,
)
from workflows.certificate import CertificateWorkflow

HOSTNAME = "x.test"
CERT_ID = "11111111-2222-3333-4444-555555555555"
NOT_AFTER = datetime(2031, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
ISSUED = IssuedCertificate(
    serial_hex="0badcafe",
    not_before=datetime(2030, 12, 4, 5, 6, 7, tzinfo=timezone.utc),
    not_after=NOT_AFTER,
)
ORDER = OpenedOrder(
    order_url="https://ca.test/order/1",
    authorization_url="https://ca.test/authz/1",
    challenge_url="https://ca.test/chall/1",
    token="tok-1",
    key_authorization="tok-1.thumbprint",
)
# Fast defaults: a test that measures a wait sets the knob it measures.
FAST_POLICY = ProvisioningPolicy(
    dns_recheck_initial_seconds=60,
    dns_recheck_max_seconds=3600,
    failure_backoff_initial_seconds=60,
    failure_backoff_max_seconds=3600,
    order_fast_poll_seconds=1,
    failed_retry_seconds=0,
)
HAPPY_STEPS = [
    "ensure_certificate",
    "check_dns",
    "create_order",
    "persist_challenge",
    "accept_challenge",
    "wait_for_order",
    "finalize_and_store",
]


def dns_cname_error() -> ApplicationError:
    return ApplicationError(
        f"{HOSTNAME} has no CNAME to edge.test",
        {
            "code": "DNS_CNAME",
            "message": f"{HOSTNAME} has no CNAME to edge.test",
            "found": [],
            "expected": "edge.test",
        },
        type="DNS_CNAME",
        non_retryable=True,
    )


def acme_temporary_error() -> ApplicationError:
    # non_retryable so the activity retry policy (4 attempts) does not replay it:
    # every raise is one failed attempt as the workflow sees it.
    return ApplicationError(
        "the CA answered 503",
        {"code": "ACME_TEMPORARY", "message": "the CA answered 503"},
        type="ACME_TEMPORARY",
        non_retryable=True,
    )


def record(**changes: Any) -> CertificateRecord:
    base = CertificateRecord(
        certificate_id=CERT_ID, hostname=HOSTNAME, tenant_id=None, status=CertificateStatus.PENDING
    )
    return base.model_copy(update=changes)


@dataclass
class Call:
    name: str
    arg: Any
    at: datetime  # the test server's (virtual) clock when the activity ran


T = TypeVar("T")

# A behaviour gets the 0-based index of this call of that activity and its input;
# it returns the result or raises.
Behaviour = Callable[[int, Any], Awaitable[Any]]


@dataclass
class Fakes:
    env: WorkflowEnvironment
    record: CertificateRecord = field(default_factory=record)
    policy: ProvisioningPolicy = FAST_POLICY
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def of(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    async def _step(self, name: str, arg: Any, default: T) -> T:
        index = len(self.of(name))
        self.calls.append(Call(name, arg, await self.env.get_current_time()))
        behaviour = self.behaviours.get(name)
        if behaviour is None:
            return default
        return cast(T, await behaviour(index, arg))

    def activities(self) -> list[Callable[..., Any]]:
        @activity.defn(name="ensure_certificate")
        async def ensure_certificate(input: EnsureCertificateInput) -> EnsureCertificateResult:
            return await self._step(
                "ensure_certificate",
                input,
                EnsureCertificateResult(record=self.record, policy=self.policy),
            )

        @activity.defn(name="check_dns")
        async def check_dns(input: CheckDnsInput) -> None:
            await self._step("check_dns", input, None)

        @activity.defn(name="create_order")
        async def create_order(input: CreateOrderInput) -> OpenedOrder:
            return await self._step("create_order", input, ORDER)

        @activity.defn(name="persist_challenge")
        async def persist_challenge(input: PersistChallengeInput) -> bool:
            return await self._step("persist_challenge", input, True)

        @activity.defn(name="accept_challenge")
        async def accept_challenge(input: AcceptChallengeInput) -> None:
            await self._step("accept_challenge", input, None)

        @activity.defn(name="wait_for_order")
        async def wait_for_order(input: WaitForOrderInput) -> OrderProgress:
            return await self._step("wait_for_order", input, OrderProgress(status="ready"))

        @activity.defn(name="finalize_and_store")
        async def finalize_and_store(input: FinalizeInput) -> IssuedCertificate:
            return await self._step("finalize_and_store", input, ISSUED)

        @activity.defn(name="record_failure")
        async def record_failure(input: RecordFailureInput) -> bool:
            return await self._step("record_failure", input, True)

        @activity.defn(name="reopen_failed")
        async def reopen_failed(certificate_id: str) -> bool:
            return await self._step("reopen_failed", certificate_id, True)

        return [
            ensure_certificate,
            check_dns,
            create_order,
            persist_challenge,
            accept_challenge,
            wait_for_order,
            finalize_and_store,
            record_failure,
            reopen_failed,
        ]


def fail_first(times: int, error: Callable[[], Exception], then: Any = None) -> Behaviour:
    async def behaviour(index: int, _: Any) -> Any:
        if index < times:
            raise error()
        return then

    return behaviour


@asynccontextmanager
async def started(
    env: WorkflowEnvironment, fakes: Fakes
) -> AsyncIterator[WorkflowHandle[Any, CertificateState]]:
    """A worker with the fakes on a fresh task queue, and the workflow started on it."""
    task_queue = f"certificate-test-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[CertificateWorkflow],
        activities=fakes.activities(),
    ):
        handle: WorkflowHandle[Any, CertificateState] = await env.client.start_workflow(
            WORKFLOW_TYPE,
            CertificateInput(hostname=HOSTNAME),
            id=f"{workflow_id_for(HOSTNAME)}:{uuid.uuid4()}",
            task_queue=task_queue,
            result_type=CertificateState,
            execution_timeout=timedelta(days=30),
        )
        yield handle


async def wait_for_phase(
    handle: WorkflowHandle[Any, Any], predicate: Callable[[CertificateState], bool], what: str
) -> CertificateState:
    """Poll the status query (time skipping stays locked meanwhile) for up to 15 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    state: CertificateState | None = None
    while loop.time() < deadline:
        state = await handle.query("status", result_type=CertificateState)
        if predicate(state):
            return state
        await asyncio.sleep(0.05)
    pytest.fail(f"workflow never reached {what}; last status: {state!r}")


def in_dns_wait(state: CertificateState) -> bool:
    return "DNS" in state.phase and state.next_attempt_at is not None


def seconds_between(calls: list[Call]) -> list[float]:
    return [(b.at - a.at).total_seconds() for a, b in zip(calls, calls[1:])]


# -- 1. happy path ---------------------------------------------------------------


async def test_happy_path_runs_every_step_once_in_order(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes) as handle:
        result = await handle.result()

    assert fakes.names() == HAPPY_STEPS
    # The challenge is stored (so the responder can answer) strictly before the CA is told to look.
    assert fakes.names().index("persist_challenge") < fakes.names().index("accept_challenge")
    assert isinstance(result, CertificateState)
    assert result.status is CertificateStatus.ACTIVE
    assert result.expires_at == NOT_AFTER
    assert result.hostname == HOSTNAME
    assert result.error_code is None and result.retry_count == 0
    assert result.phase == "done"

    # Each step got the data of the one before.
    (ensure,) = fakes.of("ensure_certificate")
    assert ensure.arg == EnsureCertificateInput(hostname=HOSTNAME, tenant_id=None)
    assert fakes.of("check_dns")[0].arg == CheckDnsInput(hostname=HOSTNAME)
    assert fakes.of("persist_challenge")[0].arg == PersistChallengeInput(
        certificate_id=CERT_ID, order=ORDER
    )
    assert fakes.of("accept_challenge")[0].arg == AcceptChallengeInput(
        challenge_url=ORDER.challenge_url
    )
    assert fakes.of("wait_for_order")[0].arg == WaitForOrderInput(
        order_url=ORDER.order_url,
        challenge_url=ORDER.challenge_url,
        within_seconds=FAST_POLICY.order_fast_poll_seconds,
    )
    assert fakes.of("finalize_and_store")[0].arg == FinalizeInput(
        certificate_id=CERT_ID, hostname=HOSTNAME, order_url=ORDER.order_url
    )


# -- 2. managed hostname ------------------------------------------------------------


async def test_managed_hostname_skips_the_dns_check(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, record=record(skips_dns=True))
    async with started(workflow_env, fakes) as handle:
        result = await handle.result()

    assert "check_dns" not in fakes.names()
    assert fakes.names() == [s for s in HAPPY_STEPS if s != "check_dns"]
    assert result.status is CertificateStatus.ACTIVE


# -- 3. order polling on durable timers ------------------------------------------------


@pytest.mark.parametrize(
    ("retry_afters", "expected_gaps"),
    [
        pytest.param((None, None), (1.0, 2.0), id="backoff-1s-then-2s"),
        pytest.param((None, 30.0), (1.0, 30.0), id="retry-after-30s-wins"),
    ],
)
async def test_order_polling_waits_on_durable_timers(
    workflow_env: WorkflowEnvironment,
    retry_afters: tuple[float | None, float | None],
    expected_gaps: tuple[float, float],
) -> None:
    async def pending_twice(index: int, _: WaitForOrderInput) -> OrderProgress:
        if index < 2:
            return OrderProgress(status="pending", retry_after_seconds=retry_afters[index])
        return OrderProgress(status="ready")

    fakes = Fakes(workflow_env, behaviours={"wait_for_order": pending_twice})
    async with started(workflow_env, fakes) as handle:
        result = await handle.result()

    polls = fakes.of("wait_for_order")
    assert len(polls) == 3
    gaps = seconds_between(polls)
    for gap, expected in zip(gaps, expected_gaps):
        # at least the timer; not much more (the fakes answer at once)
        assert expected <= gap < expected + 5, (gaps, expected_gaps)
    assert fakes.names() == HAPPY_STEPS[:-1] + ["wait_for_order"] * 2 + ["finalize_and_store"]
    assert result.status is CertificateStatus.ACTIVE


# -- 4. DNS failure that later clears ----------------------------------------------------


async def test_dns_failure_rechecks_with_backoff_until_fixed(
    workflow_env: WorkflowEnvironment,
) -> None:
    policy = FAST_POLICY.model_copy(
        update={"dns_recheck_initial_seconds": 60, "dns_recheck_max_seconds": 3600}
    )
    fakes = Fakes(
        workflow_env, policy=policy, behaviours={"check_dns": fail_first(2, dns_cname_error)}
    )
    async with started(workflow_env, fakes) as handle:
        result = await handle.result()

    assert fakes.names() == [
        "ensure_certificate",
        "check_dns",
        "record_failure",
        "check_dns",
        "record_failure",
        *HAPPY_STEPS[1:],
    ]
    failures = [c.arg for c in fakes.of("record_failure")]
    assert len(failures) == 2
    for failure in failures:
        assert isinstance(failure, RecordFailureInput)
        assert failure.certificate_id == CERT_ID
        assert failure.outcome.status is CertificateStatus.PENDING
        assert failure.outcome.error_code is ErrorCode.DNS_CNAME
        assert failure.outcome.retry_count == 0  # DNS problems do not spend the failure budget
        assert failure.outcome.keep_order is False
        assert failure.message == f"{HOSTNAME} has no CNAME to edge.test"

    gaps = seconds_between(fakes.of("check_dns"))
    assert 60 <= gaps[0] < 65, gaps
    assert 120 <= gaps[1] < 125, gaps
    assert result.status is CertificateStatus.ACTIVE
    assert result.error_code is None and result.error_message is None
    assert result.expires_at == NOT_AFTER


# -- 5. "retry" signal cuts a DNS wait short ------------------------------------------------


async def test_retry_signal_cuts_the_dns_wait_short(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(update={"dns_recheck_initial_seconds": 3600})
    fakes = Fakes(
        workflow_env, policy=policy, behaviours={"check_dns": fail_first(1, dns_cname_error)}
    )
    async with started(workflow_env, fakes) as handle:
        # Do NOT await the result yet: that would unlock time skipping and the
        # server would jump over the 3600 s wait at once. Until then the clock is
        # locked (runs in real time), so polling the query catches the wait.
        waiting = await wait_for_phase(handle, in_dns_wait, "the DNS wait")
        assert waiting.status is CertificateStatus.PENDING
        assert waiting.error_code is ErrorCode.DNS_CNAME
        first_check = fakes.of("check_dns")[0].at
        assert waiting.next_attempt_at is not None
        assert waiting.next_attempt_at - first_check >= timedelta(seconds=3590)

        await handle.signal("retry")
        result = await handle.result()

    checks = fakes.of("check_dns")
    assert len(checks) == 2
    assert (checks[1].at - checks[0].at) < timedelta(seconds=60), seconds_between(checks)
    assert result.status is CertificateStatus.ACTIVE


async def test_retry_update_cuts_the_dns_wait_short(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(update={"dns_recheck_initial_seconds": 3600})
    fakes = Fakes(
        workflow_env, policy=policy, behaviours={"check_dns": fail_first(1, dns_cname_error)}
    )
    async with started(workflow_env, fakes) as handle:
        await wait_for_phase(handle, in_dns_wait, "the DNS wait")
        answer = await handle.execute_update("retry", result_type=CertificateState)
        assert answer.status is CertificateStatus.PENDING
        result = await handle.result()

    checks = fakes.of("check_dns")
    assert len(checks) == 2
    assert (checks[1].at - checks[0].at) < timedelta(seconds=60), seconds_between(checks)
    assert result.status is CertificateStatus.ACTIVE


# -- 6. nothing to do / nothing to retry --------------------------------------------------------


async def test_active_certificate_completes_without_any_other_step(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env, record=record(status=CertificateStatus.ACTIVE, expires_at=NOT_AFTER))
    async with started(workflow_env, fakes) as handle:
        result = await handle.result()

    assert fakes.names() == ["ensure_certificate"]
    assert result.status is CertificateStatus.ACTIVE
    assert result.expires_at == NOT_AFTER
    assert result.phase == "done"


async def test_retry_update_is_rejected_before_the_record_is_known(
    workflow_env: WorkflowEnvironment,
) -> None:
    release = asyncio.Event()

    async def held(_: int, __: Any) -> EnsureCertificateResult:
        await release.wait()
        return EnsureCertificateResult(
            record=record(status=CertificateStatus.ACTIVE, expires_at=NOT_AFTER), policy=FAST_POLICY
        )

    fakes = Fakes(workflow_env, behaviours={"ensure_certificate": held})
    async with started(workflow_env, fakes) as handle:
        await wait_for_phase(handle, lambda s: s.phase == "starting", "start")
        try:
            with pytest.raises(WorkflowUpdateFailedError) as raised:
                await handle.execute_update("retry", result_type=CertificateState)
        finally:
            release.set()
        cause = raised.value.cause
        assert isinstance(cause, ApplicationError)
        assert "nothing to retry" in cause.message and "starting" in cause.message
        result = await handle.result()

    assert result.status is CertificateStatus.ACTIVE
    assert fakes.names() == ["ensure_certificate"]


# -- 7. failure budget, FAILED, then "retry" --------------------------------------------------------


async def test_temporary_failures_exhaust_the_budget_then_retry_reopens(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(
        workflow_env,
        policy=FAST_POLICY,  # failure backoff 60 s then 120 s; failed_retry_seconds=0
        behaviours={"finalize_and_store": fail_first(3, acme_temporary_error, then=ISSUED)},
    )
    async with started(workflow_env, fakes) as handle:
        # The backoffs are durable timers: skip virtual time in steps until FAILED.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while True:
            state = await handle.query("status", result_type=CertificateState)
            if state.status is CertificateStatus.FAILED and state.phase.startswith("failed"):
                break
            assert loop.time() < deadline, f"never reached FAILED: {state!r}"
            await workflow_env.sleep(10)

        assert state.error_code is ErrorCode.ACME_FAILED
        assert state.retry_count == 3
        assert state.next_attempt_at is None  # failed_retry_seconds=0: only "retry" helps
        # A whole day of virtual time changes nothing: FAILED waits for "retry".
        await workflow_env.sleep(timedelta(days=1))
        assert "reopen_failed" not in fakes.names()
        assert len(fakes.of("finalize_and_store")) == 3

        await handle.signal("retry")
        result = await handle.result()

    outcomes = [c.arg.outcome for c in fakes.of("record_failure")]
    assert [(o.status, o.retry_count, o.error_code, o.keep_order) for o in outcomes] == [
        (CertificateStatus.PROVISIONING, 1, ErrorCode.ACME_TEMPORARY, True),
        (CertificateStatus.PROVISIONING, 2, ErrorCode.ACME_TEMPORARY, True),
        (CertificateStatus.FAILED, 3, ErrorCode.ACME_FAILED, False),
    ]
    assert [c.arg.message for c in fakes.of("record_failure")] == ["the CA answered 503"] * 3

    finalizes = fakes.of("finalize_and_store")
    assert len(finalizes) == 4
    gaps = seconds_between(finalizes[:3])
    assert 60 <= gaps[0] < 75 and 120 <= gaps[1] < 135, gaps

    # The kept order is re-polled and re-finalized (no new order) until FAILED
    # drops it; after reopen_failed the next attempt starts from scratch.
    assert fakes.names() == [
        *HAPPY_STEPS[:-1],
        "finalize_and_store",
        "record_failure",
        "wait_for_order",
        "finalize_and_store",
        "record_failure",
        "wait_for_order",
        "finalize_and_store",
        "record_failure",
        "reopen_failed",
        *HAPPY_STEPS[1:],
    ]
    assert fakes.of("reopen_failed")[0].arg == CERT_ID
    assert result.status is CertificateStatus.ACTIVE
    assert result.retry_count == 0 and result.error_code is None
    assert result.expires_at == NOT_AFTER


async def test_retry_sent_during_an_attempt_that_polls_cuts_the_next_backoff(
    workflow_env: WorkflowEnvironment,
) -> None:
    polling = asyncio.Event()
    release = asyncio.Event()

    async def pending_once(index: int, _: WaitForOrderInput) -> OrderProgress:
        if index == 0:
            polling.set()
            await release.wait()
            return OrderProgress(status="pending")  # -> a 1 s durable wait, then poll again
        return OrderProgress(status="ready")

    policy = FAST_POLICY.model_copy(update={"failure_backoff_initial_seconds": 3600})
    fakes = Fakes(
        workflow_env,
        policy=policy,
        behaviours={
            "wait_for_order": pending_once,
            "finalize_and_store": fail_first(1, acme_temporary_error, then=ISSUED),
        },
    )
    async with started(workflow_env, fakes) as handle:
        await asyncio.wait_for(polling.wait(), 15)
        await handle.signal("retry")  # "retry now" during the attempt...
        await wait_for_phase(handle, lambda s: s.phase == "polling order", "the signal applied")
        release.set()
        result = await handle.result()

    finalizes = fakes.of("finalize_and_store")
    assert len(finalizes) == 2
    assert result.status is CertificateStatus.ACTIVE
    # ...should end the 3600 s failure backoff that follows it at once.
    assert (finalizes[1].at - finalizes[0].at) < timedelta(seconds=60), seconds_between(finalizes)
