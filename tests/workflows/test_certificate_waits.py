"""Durable waits of the Certificate workflow and what retry/renew do to them:
CA rate limits, the FAILED slow retry, and the retry/renew updates and signals.

See ``fakes.py`` for the fakes, the in-memory row and how time skipping is used.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateStage
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import AcmeStatus
from certflow.models import CertificateStatus, Phase
from certflow.workflow_payloads import CertificateState
from certflow.activity_payloads import OrderProgress, WaitForOrderInput

from .fakes import (
    AFTER_ISSUANCE_STEPS,
    DEFAULT,
    active_row,
    ATTEMPT_STEPS,
    CERT_ID,
    FAST_POLICY,
    HAPPY_STEPS,
    Fakes,
    Run,
    acme_temporary_error,
    dns_cname_error,
    fail_first,
    gap,
    order,
    started,
)

PENDING = CertificateStatus.PENDING
PROVISIONING = CertificateStatus.PROVISIONING
FAILED = CertificateStatus.FAILED
ACTIVE = CertificateStatus.ACTIVE

RATE_LIMIT_WAIT = "waiting for the CA's rate limit to end"
DNS_WAIT = "waiting for DNS to be fixed"
BACKOFF = "waiting before the next attempt"
FAILED_WAIT = "failed; waiting for retry"


async def until_phase(run: Run, phase: str, **kwargs: Any) -> CertificateState:
    return await run.until(lambda s: s.phase == phase, repr(phase), **kwargs)


async def rejected(run: Run, update: str) -> str:
    """Send an update that must be rejected; returns the rejection message."""
    with pytest.raises(WorkflowUpdateFailedError) as raised:
        await run.handle.execute_update(update, result_type=CertificateState)
    cause = raised.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause.message


# -- 3. CA rate limits -----------------------------------------------------------------


async def test_rate_limit_waits_for_retry_after_and_keeps_the_count(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 600)
    async with started(workflow_env, fakes) as run:
        waiting = await until_phase(run, RATE_LIMIT_WAIT)
        assert waiting.status is PENDING
        assert waiting.retry_count == 0
        assert waiting.error_code is ErrorCode.ACME_RATE_LIMITED
        assert waiting.error_message == "too many new orders recently"
        failed_at = fakes.of("place_order")[0].at
        assert waiting.next_attempt_at is not None
        # Retry-After, then a spread of up to max(5 s, 10 %) so waiters do not herd.
        assert 600 <= (waiting.next_attempt_at - failed_at).total_seconds() < 661

        await workflow_env.sleep(590)
        assert len(fakes.of("place_order")) == 1  # still cooling down

        await run.until_active(advance=5)
        (outcome,) = fakes.outcomes()
        assert (outcome.retry_count, outcome.keep_order) == (0, True)
        creates = fakes.of("place_order")
        assert 600 <= gap(creates[0], creates[1]) < 666
        assert "cooldown_remaining" not in fakes.names()  # nobody asked to retry
        assert (await run.state()).retry_count == 0
        await run.cancel()


async def test_retry_during_a_cooldown_in_force_keeps_waiting(
    workflow_env: WorkflowEnvironment,
) -> None:
    # No order is open. "retry now" makes the workflow look at the shared cooldown
    # again; while it is in force nothing goes to the CA.
    fakes = Fakes(workflow_env)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 3600)
    async with started(workflow_env, fakes) as run:
        await until_phase(run, RATE_LIMIT_WAIT)
        failed_at = fakes.of("place_order")[0].at

        await run.handle.signal("retry")
        (recheck,) = await run.until_calls("cooldown_remaining", 1)
        assert recheck.arg == fakes.row.hostname
        state = await until_phase(run, RATE_LIMIT_WAIT)
        assert state.next_attempt_at is not None
        ahead = (state.next_attempt_at - failed_at).total_seconds()
        assert 3600 - 5 < ahead < 3600 + 360 + 5  # the cooldown and its spread

        await workflow_env.sleep(1800)
        assert len(fakes.of("place_order")) == 1
        creates = await run.until_calls("place_order", 2, advance=60)
        assert 3600 <= gap(creates[0], creates[1]) < 3966
        await run.until_active()
        await run.cancel()


async def test_retry_after_the_cooldown_was_cleared_orders_again_at_once(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 3600)
    async with started(workflow_env, fakes) as run:
        waiting = await until_phase(run, RATE_LIMIT_WAIT)
        assert waiting.status is PENDING and waiting.next_attempt_at is not None

        fakes.cooldown_until = None  # an operator cleared the shared cooldown
        await run.handle.signal("retry")
        creates = await run.until_calls("place_order", 2)
        assert gap(creates[0], creates[1]) < 60
        assert len(fakes.of("cooldown_remaining")) == 1
        await run.until_active()
        assert len(fakes.of("record_failure")) == 1
        await run.cancel()


@pytest.mark.parametrize("how", ["signal", "update"])
async def test_retry_does_not_cut_a_rate_limit_wait_with_an_open_order_short(
    workflow_env: WorkflowEnvironment, how: str
) -> None:
    fakes = Fakes(workflow_env)
    fakes.behaviours["finalize_and_store"] = fakes.rate_limited(1, 600)
    async with started(workflow_env, fakes) as run:
        waiting = await until_phase(run, RATE_LIMIT_WAIT)
        assert waiting.status is PROVISIONING
        failed_at = fakes.of("finalize_and_store")[0].at

        if how == "signal":
            await run.handle.signal("retry")
        else:
            answer = await run.handle.execute_update("retry", result_type=CertificateState)
            assert answer.phase == RATE_LIMIT_WAIT, answer  # still waiting, and says so
        await run.until_calls("cooldown_remaining", 1)
        await workflow_env.sleep(300)
        # Nothing was sent to the CA: the order is polled again only after Retry-After.
        assert len(fakes.of("wait_for_order")) == 1
        assert len(fakes.of("finalize_and_store")) == 1
        assert (await run.state()).phase == RATE_LIMIT_WAIT

        polls = await run.until_calls("wait_for_order", 2, advance=30)
        assert 600 <= (polls[1].at - failed_at).total_seconds() < 666
        assert polls[1].arg.order_url == order(1).order_url
        await run.until_active()
        assert len(fakes.of("place_order")) == 1
        await run.cancel()


async def test_a_zero_retry_after_still_waits_a_second(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env)
    fakes.behaviours["finalize_and_store"] = fakes.rate_limited(2, 0)
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=0.5)
        finalizes = fakes.of("finalize_and_store")
        assert len(finalizes) == 3
        for a, b in zip(finalizes, finalizes[1:]):
            assert gap(a, b) >= 1.0  # a CA repeating "Retry-After: 0" does not make it spin
        await run.cancel()


# -- 4. FAILED and its slow automatic retry ----------------------------------------------


async def reach_failed(run: Run) -> CertificateState:
    state = await run.until(
        lambda s: s.status is FAILED and s.phase == FAILED_WAIT, "FAILED", advance=10
    )
    assert state.error_code is ErrorCode.ACME_FAILED
    assert state.retry_count == 3
    return state


async def test_failed_is_retried_daily(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(update={"failed_retry_seconds": 86400})
    fakes = Fakes(
        workflow_env,
        policy=policy,
        behaviours={"finalize_and_store": fail_first(3, acme_temporary_error)},
    )
    async with started(workflow_env, fakes) as run:
        state = await reach_failed(run)
        failed_at = fakes.of("record_failure")[-1].at
        assert state.next_attempt_at is not None
        assert 86400 <= (state.next_attempt_at - failed_at).total_seconds() < 86401

        await workflow_env.sleep(86400 - 3600)
        assert "reopen_failed" not in fakes.names()
        assert (await run.state()).status is FAILED

        (reopen,) = await run.until_calls("reopen_failed", 1, advance=600)
        assert reopen.arg == CERT_ID
        assert 86400 <= (reopen.at - failed_at).total_seconds() < 86406
        state = await run.until_active()
        # A fresh budget and a fresh order (FAILED dropped the old one).
        reopened_at = fakes.names().index("reopen_failed")
        assert fakes.names()[reopened_at + 1 :] == [*ATTEMPT_STEPS, *AFTER_ISSUANCE_STEPS]
        assert fakes.of("finalize_and_store")[-1].arg.order_url == order(2).order_url
        assert state.retry_count == 0 and state.error_code is None
        assert state.expires_at == fakes.issued[0].not_after
        await run.cancel()


async def test_failed_without_slow_retry_waits_for_retry(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, behaviours={"finalize_and_store": fail_first(3, acme_temporary_error)})
    assert fakes.policy.failed_retry_seconds == 0
    async with started(workflow_env, fakes) as run:
        state = await reach_failed(run)
        assert state.next_attempt_at is None

        # Two days of virtual time change nothing: FAILED waits for "retry".
        await workflow_env.sleep(timedelta(days=2))
        assert "reopen_failed" not in fakes.names()

        await run.handle.signal("retry")
        state = await run.until_active()
        reopened_at = fakes.names().index("reopen_failed")
        assert fakes.names()[reopened_at + 1 :] == [*ATTEMPT_STEPS, *AFTER_ISSUANCE_STEPS]
        assert state.retry_count == 0 and state.error_code is None
        await run.cancel()


# -- 5. updates during each kind of wait ----------------------------------------------------


async def test_retry_update_during_the_dns_wait(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(update={"dns_recheck_initial_seconds": 3600})
    fakes = Fakes(workflow_env, policy=policy, behaviours={"check_dns": fail_first(1, dns_cname_error)})
    async with started(workflow_env, fakes) as run:
        waiting = await until_phase(run, DNS_WAIT)
        assert waiting.next_attempt_at is not None

        answer = await run.handle.execute_update("retry", result_type=CertificateState)
        # The answer shows the attempt the wait gave way to, not the wait.
        assert answer.phase == "checking DNS", answer
        assert answer.next_attempt_at is None
        assert answer.status is PENDING

        checks = await run.until_calls("check_dns", 2)
        assert gap(checks[0], checks[1]) < 60
        await run.until_active()
        await run.cancel()


async def test_retry_update_during_the_failure_backoff(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(update={"failure_backoff_initial_seconds": 3600})
    fakes = Fakes(
        workflow_env,
        policy=policy,
        behaviours={"finalize_and_store": fail_first(1, acme_temporary_error)},
    )
    async with started(workflow_env, fakes) as run:
        waiting = await until_phase(run, BACKOFF)
        assert waiting.status is PROVISIONING and waiting.retry_count == 1

        answer = await run.handle.execute_update("retry", result_type=CertificateState)
        assert answer.phase == "polling order", answer  # the kept order is polled again
        assert answer.next_attempt_at is None

        finalizes = await run.until_calls("finalize_and_store", 2)
        assert gap(finalizes[0], finalizes[1]) < 60
        await run.until_active()
        await run.cancel()


@pytest.mark.parametrize("failed_retry_seconds", [0, 86400], ids=["no-slow-retry", "daily"])
async def test_retry_update_during_the_failed_wait(
    workflow_env: WorkflowEnvironment, failed_retry_seconds: int
) -> None:
    policy = FAST_POLICY.model_copy(update={"failed_retry_seconds": failed_retry_seconds})
    fakes = Fakes(
        workflow_env,
        policy=policy,
        behaviours={"finalize_and_store": fail_first(3, acme_temporary_error)},
    )
    async with started(workflow_env, fakes) as run:
        await reach_failed(run)
        answer = await run.handle.execute_update("retry", result_type=CertificateState)
        # The update was accepted and did reopen the certificate at once…
        (reopen,) = await run.until_calls("reopen_failed", 1)
        assert (reopen.at - fakes.of("record_failure")[-1].at).total_seconds() < 60
        await run.until_active()
        await run.cancel()

    # …and its answer shows the new phase, not the FAILED wait.
    assert answer.status is not FAILED, answer
    assert answer.phase != FAILED_WAIT, answer


async def test_retry_update_is_rejected_when_active(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        calls = len(fakes.calls)
        message = await rejected(run, "retry")
        assert "nothing to retry" in message and "ACTIVE" in message, message
        state = await run.state()
        assert state.status is ACTIVE and state.phase == "active; waiting for the renewal time"
        assert len(fakes.calls) == calls
        await run.cancel()


async def test_retry_update_before_the_row_is_read_is_decided_by_the_row(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A retry sent while the run is still reading the row waits for it, then is
    refused because the row says ACTIVE."""
    release = asyncio.Event()
    now = await workflow_env.get_current_time()
    fakes = Fakes(workflow_env, row=active_row(now, timedelta(days=90)))

    async def held(_: int, __: Any) -> Any:
        await release.wait()
        return DEFAULT

    fakes.behaviours["ensure_certificate"] = held
    # The update reaches the run at the workflow task that heartbeats the held
    # local activity: at 80 % of the task timeout (8 s at the default).
    async with started(workflow_env, fakes, task_timeout=timedelta(seconds=2)) as run:
        await run.until_calls("ensure_certificate", 1)
        # Accepted while the row is unread: a retry decided before the row would be
        # rejected by the validator here, and start_update would raise at once.
        update = await run.handle.start_update(
            "retry", wait_for_stage=WorkflowUpdateStage.ACCEPTED, result_type=CertificateState
        )
        release.set()
        with pytest.raises(WorkflowUpdateFailedError) as raised:
            await asyncio.wait_for(update.result(), 15)
        cause = raised.value.cause
        assert isinstance(cause, ApplicationError)
        assert "nothing to retry" in cause.message and "ACTIVE" in cause.message, cause.message
        await run.until_active()
        await run.cancel()


@pytest.mark.parametrize("where", ["dns-wait", "failed"])
async def test_renew_update_is_rejected_unless_active(
    workflow_env: WorkflowEnvironment, where: str
) -> None:
    if where == "dns-wait":
        fakes = Fakes(workflow_env, behaviours={"check_dns": fail_first(1, dns_cname_error)})
    else:
        fakes = Fakes(workflow_env, behaviours={"finalize_and_store": fail_first(3, acme_temporary_error)})
    async with started(workflow_env, fakes) as run:
        if where == "dns-wait":
            await until_phase(run, DNS_WAIT)
            status = PENDING
        else:
            await reach_failed(run)
            status = FAILED
        message = await rejected(run, "renew")
        assert "nothing to renew" in message and str(status) in message, message
        assert "begin_renewal" not in fakes.names()
        assert (await run.state()).status is status
        await run.cancel()


@pytest.mark.parametrize("how", ["update", "signal"])
async def test_renew_during_the_renewal_wait_renews_at_once(
    workflow_env: WorkflowEnvironment, how: str
) -> None:
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes) as run:
        waiting = await run.until_active()
        assert waiting.next_attempt_at is not None
        asked_at = await run.now()
        if how == "update":
            answer = await run.handle.execute_update("renew", result_type=CertificateState)
            # The renewal has started: the answer says so (or the row already does).
            assert answer.status is CertificateStatus.RENEWING or answer.phase == "renewing", answer
        else:
            await run.handle.signal("renew")

        (begun,) = await run.until_calls("begin_renewal", 1)
        assert begun.arg == CERT_ID
        assert (begun.at - asked_at).total_seconds() < 60
        assert begun.at < waiting.next_attempt_at - timedelta(days=1)

        state = await run.until_active(serial_count=2)
        first, second = fakes.issued
        assert second.serial_hex != first.serial_hex
        assert state.expires_at == second.not_after
        renewed_at = fakes.names().index("begin_renewal")
        assert fakes.names()[renewed_at - 1 :] == [
            "ensure_certificate",  # the run after the first issuance reads before it renews
            "begin_renewal",
            *ATTEMPT_STEPS,
            *AFTER_ISSUANCE_STEPS,
        ]
        await run.cancel()


async def test_renewing_shows_in_the_status_query(workflow_env: WorkflowEnvironment) -> None:
    """While a renewal attempt runs, the status query says RENEWING and the old
    certificate stays in place (its expiry is still shown)."""
    polling = asyncio.Event()
    release = asyncio.Event()

    async def held(index: int, _: WaitForOrderInput) -> Any:
        if index == 1:  # the renewal's order
            polling.set()
            await release.wait()
        return OrderProgress(status=AcmeStatus.READY)

    fakes = Fakes(workflow_env, behaviours={"wait_for_order": held})
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        await run.handle.signal("renew")
        await asyncio.wait_for(polling.wait(), 15)
        try:
            state = await run.state()
        finally:
            release.set()
        assert state.status is CertificateStatus.RENEWING
        assert state.phase is Phase.ORDERING  # the order placed and validated in one step
        assert state.expires_at == fakes.issued[0].not_after
        assert fakes.row.status is CertificateStatus.RENEWING
        await run.until_active(serial_count=2)
        await run.cancel()


async def test_retry_sent_during_an_attempt_that_polls_cuts_the_next_backoff(
    workflow_env: WorkflowEnvironment,
) -> None:
    polling = asyncio.Event()
    release = asyncio.Event()

    async def pending_once(index: int, _: WaitForOrderInput) -> Any:
        if index == 0:
            polling.set()
            await release.wait()
            return OrderProgress(status=AcmeStatus.PENDING)  # -> a 1 s durable wait, then poll again
        return OrderProgress(status=AcmeStatus.READY)

    policy = FAST_POLICY.model_copy(update={"failure_backoff_initial_seconds": 3600})
    fakes = Fakes(
        workflow_env,
        policy=policy,
        behaviours={
            "wait_for_order": pending_once,
            "finalize_and_store": fail_first(1, acme_temporary_error),
        },
    )
    async with started(workflow_env, fakes) as run:
        await asyncio.wait_for(polling.wait(), 15)
        await run.handle.signal("retry")  # "retry now" during the attempt...
        await until_phase(run, Phase.ORDERING)
        release.set()
        finalizes = await run.until_calls("finalize_and_store", 2)
        # ...ends the 3600 s failure backoff that follows it at once.
        assert gap(finalizes[0], finalizes[1]) < 60
        assert fakes.names()[: len(HAPPY_STEPS) + 1] == HAPPY_STEPS[:-1] + [
            "wait_for_order",
            "finalize_and_store",
        ]
        await run.until_active()
        await run.cancel()
