"""The HTTP-01 self-check before accept and the CA's terminal refusals, on the
time-skipping test server (docs/lifecycle.md, "Before the CA is asked", and "Statuses and errors").

A failed self-check is never sent to the CA: the certificate stays PENDING, the
failure budget untouched, the order kept (it was never accepted), and the check
is repeated on the DNS backoff; "retry" cuts the wait. A refusal of the name
(ACME_REJECTED) is FAILED at once and waits for an operator's retry.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, Phase
from certflow.workflow_payloads import CertificateState

from .fakes import (
    AFTER_ISSUANCE_STEPS,
    FAST_POLICY,
    HAPPY_STEPS,
    Fakes,
    app_error,
    fail_first,
    gap,
    order,
    started,
)

UNREACHABLE = "GET http://x.test/.well-known/acme-challenge/tok-1 from 127.0.0.9:80 answered 404"


def unreachable() -> Exception:
    return app_error(ErrorCode.HTTP01_UNREACHABLE, UNREACHABLE)


async def test_an_unreachable_challenge_waits_pending_with_its_order_and_budget(
    workflow_env: WorkflowEnvironment,
) -> None:
    policy = FAST_POLICY.model_copy(update={"dns_recheck_initial_seconds": 3600})
    fakes = Fakes(workflow_env, policy=policy, behaviours={"check_http01": fail_first(1, unreachable)})
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(lambda s: s.phase == Phase.WAITING_FOR_HTTP01, "the edge wait")
        assert waiting.status is CertificateStatus.PENDING
        assert (waiting.error_code, waiting.error_message) == (ErrorCode.HTTP01_UNREACHABLE, UNREACHABLE)
        assert waiting.retry_count == 0
        checked_at = fakes.of("check_http01")[0].at
        assert waiting.next_attempt_at is not None
        assert 3600 <= (waiting.next_attempt_at - checked_at).total_seconds() < 3601
        # Nothing was asked of the CA: no accept, no poll.
        assert "wait_for_order" not in fakes.names()
        (outcome,) = fakes.outcomes()
        assert (outcome.keep_order, outcome.retry_count) == (True, 0)

        # Fixed at the edge; "retry" cuts the wait, the same order is checked and accepted.
        answer = await run.handle.execute_update("retry", result_type=CertificateState)
        assert answer.status is CertificateStatus.PENDING
        checks = await run.until_calls("check_http01", 2)
        assert gap(checks[0], checks[1]) < 60
        await run.until_active()
        assert len(fakes.of("place_order")) == 1
        (accepting,) = fakes.of("wait_for_order")
        assert accepting.arg.accept_first and accepting.arg.order_url == order(1).order_url
        assert fakes.names()[-1] == "finalize_and_store"  # the next run read nothing
        await run.cancel()


async def test_the_self_check_repeats_on_the_dns_backoff(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(
        update={"dns_recheck_initial_seconds": 60, "dns_recheck_max_seconds": 240}
    )
    fakes = Fakes(workflow_env, policy=policy, behaviours={"check_http01": fail_first(4, unreachable)})
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=30)
        checks = fakes.of("check_http01")
        assert len(checks) == 5
        gaps = [gap(a, b) for a, b in zip(checks, checks[1:])]
        assert [round(g / 60) for g in gaps] == [1, 2, 4, 4], gaps
        assert len(fakes.of("place_order")) == 1
        assert "record_failure" in fakes.names() and fakes.outcomes()[-1].retry_count == 0
        await run.cancel()


async def test_no_self_check_when_it_is_turned_off(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(update={"http01_self_check": False})
    fakes = Fakes(workflow_env, policy=policy)
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        assert fakes.names() == [n for n in HAPPY_STEPS if n != "check_http01"] + AFTER_ISSUANCE_STEPS
        await run.cancel()


async def test_a_refused_name_is_failed_at_once_and_waits_for_an_operator(
    workflow_env: WorkflowEnvironment,
) -> None:
    detail = "the CA refused to issue for this hostname: Cannot issue for \"x.test\": forbidden"
    policy = FAST_POLICY.model_copy(update={"failed_retry_seconds": 86400})
    fakes = Fakes(
        workflow_env,
        policy=policy,
        behaviours={
            "place_order": fail_first(1, lambda: app_error(ErrorCode.ACME_REJECTED, detail))
        },
    )
    async with started(workflow_env, fakes) as run:
        failed = await run.until(lambda s: s.phase == Phase.FAILED_WAITING, "FAILED", advance=10)
        assert failed.status is CertificateStatus.FAILED
        assert (failed.error_code, failed.error_message) == (ErrorCode.ACME_REJECTED, detail)
        assert failed.next_attempt_at is None  # no slow automatic retry for a refusal
        assert len(fakes.of("record_failure")) == 1

        await workflow_env.sleep(timedelta(days=3))
        assert "reopen_failed" not in fakes.names()
        await run.handle.signal("retry")
        state = await run.until_active()
        assert state.retry_count == 0 and state.error_code is None
        assert len(fakes.of("place_order")) == 2
        await run.cancel()
