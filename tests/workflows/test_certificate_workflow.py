"""The Certificate workflow on Temporal's time-skipping test server: issuance and
the table of docs/lifecycle.md, "Statuses and errors", each row driven through the workflow.

See ``fakes.py`` for the fakes, the in-memory row and how time skipping is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from workflows.patches import (
    ORDER_IN_ONE_STEP_DESIGN,
    RUN_KEPT_AFTER_ISSUANCE_DESIGN,
)
from workflows.steps import ORDER_AND_VALIDATE_RETRY
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode, StoreUnavailableError, to_application_error
from certflow.models import AcmeStatus, RequestedMethod
from certflow.models import CertificateStatus
from certflow.activity_payloads import (
    CheckDnsInput,
    EnsureCertificateInput,
    FinalizeInput,
    OrderProgress,
    Outcome,
    PlaceOrderInput,
    RecordFailureInput,
    RowRequest,
    WaitForOrderInput,
)
from workflows.policy import failure_backoff
from workflows.steps import SHORT_FAULT_RETRY

from .fakes import (
    renewal_at,
    AFTER_ISSUANCE_STEPS,
    ATTEMPT_STEPS,
    CERT_ID,
    DEFAULT,
    FAST_POLICY,
    HAPPY_STEPS,
    HOSTNAME,
    Fakes,
    Row,
    acme_temporary_error,
    app_error,
    dns_caa_error,
    dns_cname_error,
    fail_first,
    gap,
    invalid_order_error,
    order,
    seconds_between,
    started,
)

PENDING = CertificateStatus.PENDING
PROVISIONING = CertificateStatus.PROVISIONING
FAILED = CertificateStatus.FAILED


def as_tuple(outcome: Outcome) -> tuple[CertificateStatus, int, bool, ErrorCode]:
    return (outcome.status, outcome.retry_count, outcome.keep_order, outcome.error_code)


# -- 1. happy path ------------------------------------------------------------------


@pytest.mark.parametrize("design", [ORDER_IN_ONE_STEP_DESIGN, RUN_KEPT_AFTER_ISSUANCE_DESIGN])
async def test_happy_path_issues_in_order_and_goes_active(
    workflow_env: WorkflowEnvironment, design: int
) -> None:
    """Issued, then the renewal wait from the (now ACTIVE) row, read nowhere: in a new
    run (continue-as-new) or, from RUN_KEPT_AFTER_ISSUANCE_DESIGN on, in the same one.
    Red for that design with the run not kept: the run id changed."""
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes, design=design) as run:
        first_run_id = run.handle.first_execution_run_id
        state = await run.until_active()

        assert fakes.names() == HAPPY_STEPS + AFTER_ISSUANCE_STEPS
        kept = await run.run_id() == first_run_id
        assert kept is (design >= RUN_KEPT_AFTER_ISSUANCE_DESIGN)

        (issued,) = fakes.issued
        assert state.status is CertificateStatus.ACTIVE
        assert state.hostname == HOSTNAME
        assert state.expires_at == issued.not_after
        assert state.error_code is None and state.error_message is None
        assert state.retry_count == 0
        assert state.next_attempt_at == renewal_at(issued.not_before, issued.not_after)
        assert fakes.row.status is CertificateStatus.ACTIVE

        result = await run.cancel()

    assert result.phase == "canceled"
    # Each step got the data of the one before.
    first = order(1)
    assert fakes.of("ensure_certificate")[0].arg == EnsureCertificateInput(hostname=HOSTNAME)
    # The row was read in the same workflow task: the DNS check is handed what it asks for.
    assert fakes.of("check_dns")[0].arg == CheckDnsInput(
        hostname=HOSTNAME, row=RowRequest(requested_method=RequestedMethod.AUTO, tenant_id=None)
    )
    assert fakes.of("place_order")[0].arg == PlaceOrderInput(
        certificate_id=CERT_ID, hostname=HOSTNAME
    )
    # The challenge was persisted by place_order; the first poll accepts it.
    assert fakes.of("wait_for_order")[0].arg == WaitForOrderInput(
        order_url=first.order_url,
        challenge_url=first.challenge_url,
        within_seconds=FAST_POLICY.order_fast_poll_seconds,
        accept_first=True,
    )
    assert fakes.of("finalize_and_store")[0].arg == FinalizeInput(
        certificate_id=CERT_ID, hostname=HOSTNAME, order_url=first.order_url
    )
    assert "renewal_info" not in fakes.names()  # the renewal-info sweep asks the CA
    assert [c.arg for c in fakes.of("cancel_certificate")] == [CERT_ID]
    assert "deactivate_authorizations" not in fakes.names()  # no order was open
    assert "record_failure" not in fakes.names()


async def test_managed_hostname_skips_the_dns_check(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, row=Row(skips_dns=True))
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        assert fakes.names() == [s for s in HAPPY_STEPS if s != "check_dns"] + AFTER_ISSUANCE_STEPS
        await run.cancel()


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
            return OrderProgress(status=AcmeStatus.PENDING, retry_after_seconds=retry_afters[index])
        return OrderProgress(status=AcmeStatus.READY)

    fakes = Fakes(workflow_env, behaviours={"wait_for_order": pending_twice})
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=2)  # timers fire on time whatever the step
        polls = fakes.of("wait_for_order")
        assert len(polls) == 3
        gaps = seconds_between(polls)
        for measured, expected in zip(gaps, expected_gaps):
            # at least the timer; not much more (the fakes answer at once)
            assert expected <= measured < expected + 2, (gaps, expected_gaps)
        assert fakes.names() == HAPPY_STEPS[:-1] + ["wait_for_order"] * 2 + [
            "finalize_and_store",
            *AFTER_ISSUANCE_STEPS,
        ]
        await run.cancel()


# -- 2. the table of docs/lifecycle.md, "Statuses and errors" through the workflow --------------------------------------


@pytest.mark.parametrize(
    ("error", "code"),
    [
        pytest.param(dns_cname_error, ErrorCode.DNS_CNAME, id="DNS_CNAME"),
        pytest.param(dns_caa_error, ErrorCode.DNS_CAA, id="DNS_CAA"),
    ],
)
async def test_dns_error_keeps_pending_and_rechecks_with_backoff(
    workflow_env: WorkflowEnvironment, error: Callable[[], ApplicationError], code: ErrorCode
) -> None:
    fakes = Fakes(workflow_env, behaviours={"check_dns": fail_first(3, error)})
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(
            lambda s: "DNS" in (s.phase or "") and s.next_attempt_at is not None, "the DNS wait"
        )
        assert waiting.status is PENDING
        assert waiting.error_code is code
        assert waiting.error_message == error().message
        assert waiting.retry_count == 0
        assert waiting.phase == "waiting for DNS to be fixed"
        first_check = fakes.of("check_dns")[0].at
        assert waiting.next_attempt_at is not None
        assert timedelta(seconds=60) <= waiting.next_attempt_at - first_check < timedelta(seconds=61)

        await run.until_active(advance=20)

        # DNS problems never spend the failure budget and clear any ACME state.
        assert [as_tuple(o) for o in fakes.outcomes()] == [(PENDING, 0, False, code)] * 3
        for call in fakes.of("record_failure"):
            assert call.arg == RecordFailureInput(
                certificate_id=CERT_ID, outcome=call.arg.outcome, message=error().message
            )
        assert fakes.names() == [
            "ensure_certificate",
            *(["check_dns", "record_failure"] * 3),
            *ATTEMPT_STEPS,
            *AFTER_ISSUANCE_STEPS,
        ]
        # dns_recheck_initial_seconds, doubling: 60, 120, 240
        gaps = seconds_between(fakes.of("check_dns"))
        for measured, expected in zip(gaps, (60, 120, 240)):
            assert expected <= measured < expected + 21, gaps
        state = await run.state()
        assert state.error_code is None and state.error_message is None
        await run.cancel()


async def test_rate_limited_without_open_order_keeps_count_and_orders_again(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 120)
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=10)
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PENDING, 0, True, ErrorCode.ACME_RATE_LIMITED)
        ]
        assert fakes.names() == [
            "ensure_certificate",
            "check_dns",
            "place_order",
            "load_certificate",  # order_and_validate failed: did it place an order? no
            "record_failure",
            *ATTEMPT_STEPS,  # no order was open: the next attempt starts over
            *AFTER_ISSUANCE_STEPS,
        ]
        creates = fakes.of("place_order")
        # Retry-After, plus a spread of up to max(5 s, 10 %) so waiters do not herd.
        assert 120 <= gap(creates[0], creates[1]) < 120 + 12 + 11
        await run.cancel()


async def test_rate_limited_with_open_order_keeps_it_and_polls_it_again(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env)
    fakes.behaviours["finalize_and_store"] = fakes.rate_limited(1, 120)
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(lambda s: s.error_code is not None, "the rate-limit wait")
        assert waiting.status is PROVISIONING
        assert waiting.retry_count == 0
        assert fakes.row.order_url == order(1).order_url  # kept in the row too

        await run.until_active(advance=10)
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PROVISIONING, 0, True, ErrorCode.ACME_RATE_LIMITED)
        ]
        failed_at = fakes.names().index("record_failure")
        # The kept order: the next attempt starts with wait_for_order, no new order.
        assert fakes.names()[failed_at + 1 :] == [
            "wait_for_order",
            "finalize_and_store",
            *AFTER_ISSUANCE_STEPS,
        ]
        assert fakes.of("wait_for_order")[1].arg.order_url == order(1).order_url
        finalizes = fakes.of("finalize_and_store")
        assert finalizes[1].arg.order_url == order(1).order_url
        # Retry-After 120 s, plus its spread (up to 10 % of it: 12 s), plus a second
        # of timer granularity: 131.96 s was seen.
        assert 120 <= seconds_between(fakes.of("wait_for_order"))[0] < 120 + 12 + 1
        assert len(fakes.of("place_order")) == 1
        await run.cancel()


async def test_invalid_order_spends_budget_and_clears_the_order(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env, behaviours={"wait_for_order": fail_first(1, invalid_order_error)})
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(
            lambda s: s.phase == "waiting before the next attempt", "the failure backoff"
        )
        assert waiting.status is PENDING
        assert waiting.retry_count == 1
        assert waiting.error_code is ErrorCode.ACME_INVALID_ORDER
        assert fakes.row.order_url is None

        await run.until_active(advance=10)
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PENDING, 1, False, ErrorCode.ACME_INVALID_ORDER)
        ]
        failed_at = fakes.names().index("record_failure")
        assert fakes.names()[failed_at + 1 :] == [*ATTEMPT_STEPS, *AFTER_ISSUANCE_STEPS]
        assert fakes.orders_created == 2  # a NEW order
        assert fakes.of("finalize_and_store")[0].arg.order_url == order(2).order_url
        checks = fakes.of("check_dns")
        backoff = failure_backoff(1, FAST_POLICY)
        assert backoff <= gap(checks[0], checks[1]) < backoff + 11
        await run.cancel()


async def test_temporary_error_with_open_order_keeps_it(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, behaviours={"finalize_and_store": fail_first(1, acme_temporary_error)})
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(
            lambda s: s.phase == "waiting before the next attempt", "the failure backoff"
        )
        assert waiting.status is PROVISIONING
        assert waiting.retry_count == 1
        assert waiting.error_code is ErrorCode.ACME_TEMPORARY
        assert waiting.error_message == "the CA answered 503"

        await run.until_active(advance=10)
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PROVISIONING, 1, True, ErrorCode.ACME_TEMPORARY)
        ]
        failed_at = fakes.names().index("record_failure")
        assert fakes.names()[failed_at + 1 :] == [
            "wait_for_order",
            "finalize_and_store",
            *AFTER_ISSUANCE_STEPS,
        ]
        finalizes = fakes.of("finalize_and_store")
        assert [f.arg.order_url for f in finalizes] == [order(1).order_url] * 2
        assert 60 <= gap(finalizes[0], finalizes[1]) < 71
        await run.cancel()


async def test_the_record_after_a_failure_is_the_row_as_stored(
    workflow_env: WorkflowEnvironment,
) -> None:
    """The workflow takes the row record_failure returned (RETURNING) as its record,
    not a rebuild of its own: a CA's detail longer than the 2,000 characters the
    row keeps is shown as stored. Shown red with ``rows.set_written`` ignoring the row
    (the record rebuilt, as runs from before rows were returned do): the status
    showed all 3,000 characters."""
    detail = "the CA answered 503: " + "x" * 3000

    def long_503() -> ApplicationError:
        return app_error(ErrorCode.ACME_TEMPORARY, detail)

    fakes = Fakes(workflow_env, behaviours={"finalize_and_store": fail_first(1, long_503)})
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(
            lambda s: s.phase == "waiting before the next attempt", "the failure backoff"
        )
        assert waiting.error_message is not None and len(waiting.error_message) == 2000
        assert waiting.error_message == fakes.row.error_message
        await run.cancel()


async def test_temporary_error_without_open_order_orders_again(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env, behaviours={"place_order": fail_first(1, acme_temporary_error)})
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=10)
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PENDING, 1, False, ErrorCode.ACME_TEMPORARY)
        ]
        failed_at = fakes.names().index("record_failure")
        assert fakes.names()[failed_at + 1 :] == [*ATTEMPT_STEPS, *AFTER_ISSUANCE_STEPS]
        creates = fakes.of("place_order")
        assert 60 <= gap(creates[0], creates[1]) < 71
        await run.cancel()


async def test_third_failure_is_failed_with_acme_failed(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, behaviours={"finalize_and_store": fail_first(3, acme_temporary_error)})
    async with started(workflow_env, fakes) as run:
        state = await run.until(
            lambda s: s.status is FAILED and s.phase == "failed; waiting for retry",
            "FAILED",
            advance=10,
        )
        assert state.error_code is ErrorCode.ACME_FAILED
        assert state.retry_count == 3
        assert state.next_attempt_at is None  # failed_retry_seconds=0: only "retry" helps
        assert fakes.row.status is FAILED and fakes.row.order_url is None

        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PROVISIONING, 1, True, ErrorCode.ACME_TEMPORARY),
            (PROVISIONING, 2, True, ErrorCode.ACME_TEMPORARY),
            (FAILED, 3, False, ErrorCode.ACME_FAILED),
        ]
        assert [c.arg.message for c in fakes.of("record_failure")] == ["the CA answered 503"] * 3
        # The kept order is re-polled and re-finalized (no new order) until FAILED drops it.
        assert fakes.names() == [
            *HAPPY_STEPS,
            "record_failure",
            "wait_for_order",
            "finalize_and_store",
            "record_failure",
            "wait_for_order",
            "finalize_and_store",
            "record_failure",
        ]
        gaps = seconds_between(fakes.of("finalize_and_store"))
        assert 60 <= gaps[0] < 71 and 120 <= gaps[1] < 131, gaps
        await run.cancel()


# -- short faults are absorbed by the activity retry policy ----------------------------------


async def test_short_faults_are_retried_inside_one_attempt(workflow_env: WorkflowEnvironment) -> None:
    def retryable() -> ApplicationError:
        return app_error(ErrorCode.ACME_TEMPORARY, "badNonce", non_retryable=False)

    fakes = Fakes(workflow_env, behaviours={"wait_for_order": fail_first(2, retryable)})
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=1)
        assert [c.arg.accept_first for c in fakes.of("wait_for_order")] == [True] * 3
        assert "record_failure" not in fakes.names()
        await run.cancel()


async def test_an_unexpected_exception_counts_as_one_temporary_failure_after_retries(
    workflow_env: WorkflowEnvironment,
) -> None:
    async def broken(index: int, _: object) -> object:
        if index < 4:
            raise RuntimeError("resolver exploded")
        return DEFAULT

    fakes = Fakes(workflow_env, behaviours={"check_dns": broken})
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=5)
        # 4 activity attempts (the CA retry policy), then one failed attempt.
        assert fakes.names()[:6] == ["ensure_certificate", *["check_dns"] * 4, "record_failure"]
        (failure,) = fakes.of("record_failure")
        assert as_tuple(failure.arg.outcome) == (PENDING, 1, False, ErrorCode.ACME_TEMPORARY)
        assert failure.arg.message.startswith("check_dns failed")
        assert "resolver exploded" in failure.arg.message
        await run.cancel()



def answered_twice_then_lost() -> Callable[[int, object], Awaitable[object]]:
    """finalize_and_store fails twice (the CA answered 503), then its third attempt's
    tries meet short faults and the last one stalls without a heartbeat, as a
    SIGKILLed worker's does, until Temporal times it out; then it works."""

    async def behaviour(index: int, _: object) -> object:
        if index < 2:
            raise acme_temporary_error()
        if index < 2 + 3:  # the third attempt's first three tries: short faults
            raise app_error(ErrorCode.ACME_TEMPORARY, "badNonce", non_retryable=False)
        if index == 2 + 3:  # its last (SHORT_FAULT_RETRY's fourth) stalls: no heartbeat
            await asyncio.Event().wait()  # until the worker shuts down
        return DEFAULT

    return behaviour


async def test_an_attempt_ended_by_a_lost_worker_does_not_spend_the_budget(
    workflow_env: WorkflowEnvironment,
) -> None:
    """Two failed attempts (the CA answered 503), then a third whose finalize_and_store
    ended on a try that stalled until Temporal's heartbeat timeout (as a SIGKILLed
    worker's does: no answer of the CA's): the third leaves the retry count at 2 and the
    order kept, so the certificate waits and is issued, not FAILED. Chaos met this:
    a kill made one hostname's validate_order time out, charged (ACME_TEMPORARY) next
    to an order the CA invalidated while the responder was down, two of the three;
    one clean-clone chaos run went red on a FAILED transition.

    Shown red: with ``_record_failure``'s ``charged=`` argument removed (a timeout
    spends the budget, as before LOST_WORKER_PATCH), the third attempt made it FAILED
    (ACME_FAILED, retry count 3) and the wait for ACTIVE timed out.
    """

    fakes = Fakes(workflow_env, behaviours={"finalize_and_store": answered_twice_then_lost()})
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=10)
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PROVISIONING, 1, True, ErrorCode.ACME_TEMPORARY),
            (PROVISIONING, 2, True, ErrorCode.ACME_TEMPORARY),
            (PROVISIONING, 2, True, ErrorCode.ACME_TEMPORARY),
        ]
        lost = fakes.of("record_failure")[2].arg.message
        assert lost.startswith("finalize_and_store failed: "), lost
        # The kept order was finalized each time: no new order.
        assert {c.arg.order_url for c in fakes.of("finalize_and_store")} == {order(1).order_url}
        assert fakes.orders_created == 1
        await run.cancel()


async def test_a_postgres_outage_does_not_spend_the_budget(
    workflow_env: WorkflowEnvironment,
) -> None:
    """Three attempts whose finalize_and_store met Postgres away on every try (as the
    worker's StoreOutageInterceptor types it: StoreUnavailableError, retried as a
    short fault): each is recorded, none is charged, the order is kept, and the
    certificate is issued; three restarts of our own database never make it FAILED.

    Shown red: with ``failure_of`` not reading ``store_unavailable`` (an outage
    charged like a 503, as before), the third attempt made it FAILED (ACME_FAILED,
    retry count 3) and the wait for ACTIVE timed out.
    """
    tries = SHORT_FAULT_RETRY.maximum_attempts

    async def postgres_away(index: int, _: object) -> object:
        if index < 3 * tries:
            outage = StoreUnavailableError(
                message="Postgres did not answer: ConnectionDoesNotExistError: connection was closed"
            )
            raise to_application_error(outage)
        return DEFAULT

    fakes = Fakes(workflow_env, behaviours={"finalize_and_store": postgres_away})
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=10)
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PROVISIONING, 0, True, ErrorCode.ACME_TEMPORARY)
        ] * 3
        assert all("Postgres did not answer" in c.arg.message for c in fakes.of("record_failure"))
        assert fakes.orders_created == 1
        await run.cancel()


def order_persisted_then_lost(fakes: Fakes, tries: int = 4) -> Callable[[int, object], Awaitable[object]]:
    """place_order's first try opens an order and commits it to the row, then meets a
    short fault; the next ones fail before reading the row (Postgres away), and the
    last of the step's ``tries`` stalls without a heartbeat until Temporal times it
    out (a SIGKILLed worker's): the row holds an order the workflow never heard of."""

    async def behaviour(index: int, _: object) -> object:
        if index == 0:
            fakes.orders_created += 1
            fakes.row.status = CertificateStatus.PROVISIONING
            fakes.row.order_url = order(fakes.orders_created).order_url
            fakes.row.challenge_url = order(fakes.orders_created).challenge_url
        if index < tries - 1:
            raise app_error(ErrorCode.ACME_TEMPORARY, "badNonce", non_retryable=False)
        if index == tries - 1:
            await asyncio.Event().wait()  # until the worker shuts down
        return DEFAULT

    return behaviour


async def test_a_lost_order_and_validate_keeps_the_order_it_placed(
    workflow_env: WorkflowEnvironment,
) -> None:
    """An order_and_validate lost to a dead worker after its order was committed to
    the row (``order_persisted_then_lost``): the workflow
    reads the row again when the activity fails, so it knows of the order the
    activity placed; the attempt is not charged, the order is kept, and the next
    attempt validates it: one order in all, no PENDING row holding one.

    Shown red: without the re-read in ``Obtaining._order_and_validate`` the order
    was cleared with the attempt and the next one placed a second (nine
    place_order calls, two orders)."""
    fakes = Fakes(workflow_env)
    tries = ORDER_AND_VALIDATE_RETRY.maximum_attempts
    fakes.behaviours["place_order"] = order_persisted_then_lost(fakes, tries)
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=10)
        assert len(fakes.of("place_order")) == tries  # every try; the next attempt validates the kept order
        assert [as_tuple(o) for o in fakes.outcomes()] == [
            (PROVISIONING, 0, True, ErrorCode.ACME_TEMPORARY)
        ]
        assert fakes.orders_created == 1
        assert {c.arg.order_url for c in fakes.of("finalize_and_store")} == {order(1).order_url}
        await run.cancel()


# -- the row moved on without the workflow (a store whose result was lost) ------------------


def stored_but_result_lost(fakes: Fakes) -> Callable[[int, FinalizeInput], Awaitable[None]]:
    """finalize_and_store commits the certificate, then the worker dies before
    Temporal hears of it and every retry fails (Postgres away): the row is ACTIVE
    while the workflow sees one failed attempt."""

    async def behaviour(_: int, __: FinalizeInput) -> None:
        now = await fakes.env.get_current_time()
        row = fakes.row
        row.status = CertificateStatus.ACTIVE
        row.serial = "stored"
        row.not_before, row.expires_at = now, now + fakes.lifetime
        row.clear_order()
        raise acme_temporary_error()

    return behaviour


async def test_a_row_stored_by_a_lost_attempt_keeps_the_workflow(
    workflow_env: WorkflowEnvironment,
) -> None:
    """BUG-6: record_failure finds the row ACTIVE and skips it; the workflow re-reads
    the row and waits for the renewal of the certificate it holds (it used to end)."""
    fakes = Fakes(workflow_env)
    fakes.behaviours["finalize_and_store"] = stored_but_result_lost(fakes)
    async with started(workflow_env, fakes) as run:
        state = await run.until_active()
        assert state.expires_at == fakes.row.expires_at
        assert fakes.names() == [*HAPPY_STEPS, "record_failure", "load_certificate"]
        assert fakes.of("load_certificate")[0].arg == CERT_ID
        assert len(fakes.of("place_order")) == 1
        # Renewal still happens on time, from the certificate the row holds.
        assert (await run.state()).next_attempt_at is not None
        await run.cancel()


async def test_a_row_deleted_during_an_attempt_ends_the_workflow(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env)

    async def deleted(_: int, __: FinalizeInput) -> None:
        fakes.row.deleted = True
        raise acme_temporary_error()

    fakes.behaviours["finalize_and_store"] = deleted
    async with started(workflow_env, fakes) as run:
        result = await run.result()
    assert result.phase == "the certificate row is gone"
    assert fakes.names()[-2:] == ["record_failure", "load_certificate"]
