"""Cancel and delete (with and without revocation) of the Certificate workflow.

See ``fakes.py`` for the fakes, the in-memory row and how time skipping is used.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import AcmeStatus
from certflow.models import CertificateStatus
from certflow.workflow_payloads import CertificateState, DeleteRequest
from certflow.activity_payloads import OrderProgress, WaitForOrderInput

from .fakes import (
    CERT_ID,
    DEFAULT,
    FAST_POLICY,
    Fakes,
    Run,
    acme_temporary_error,
    app_error,
    dns_cname_error,
    fail_first,
    order,
    started,
)

CANCELED = CertificateStatus.CANCELED


async def until_phase(run: Run, phase: str) -> CertificateState:
    return await run.until(lambda s: s.phase == phase, repr(phase))


SLOW = FAST_POLICY.model_copy(
    update={
        "dns_recheck_initial_seconds": 3600,
        "failure_backoff_initial_seconds": 3600,
        "failed_retry_seconds": 0,
    }
)


@pytest.mark.parametrize(
    ("wait", "open_order"),
    [
        pytest.param("dns", None, id="DNS-wait"),
        pytest.param("backoff", order(1).order_url, id="failure-backoff-with-kept-order"),
        pytest.param("failed", None, id="FAILED-wait"),
        pytest.param("polling", order(1).order_url, id="order-polling"),
        pytest.param("renewal", None, id="renewal-wait"),
    ],
)
async def test_cancel_ends_every_kind_of_wait(
    workflow_env: WorkflowEnvironment, wait: str, open_order: str | None
) -> None:
    fakes = Fakes(workflow_env, policy=SLOW)
    if wait == "dns":
        fakes.behaviours["check_dns"] = fail_first(1, dns_cname_error)
    elif wait == "backoff":
        fakes.behaviours["finalize_and_store"] = fail_first(1, acme_temporary_error)
    elif wait == "failed":
        fakes.behaviours["finalize_and_store"] = fail_first(3, acme_temporary_error)
    elif wait == "polling":

        async def pending(_: int, __: WaitForOrderInput) -> OrderProgress:
            return OrderProgress(status=AcmeStatus.PENDING, retry_after_seconds=3600)

        fakes.behaviours["wait_for_order"] = pending

    async with started(workflow_env, fakes) as run:
        if wait == "dns":
            waiting = await until_phase(run, "waiting for DNS to be fixed")
        elif wait == "backoff":
            waiting = await until_phase(run, "waiting before the next attempt")
        elif wait == "failed":
            waiting = await run.until(
                lambda s: s.phase == "failed; waiting for retry", "FAILED", advance=600
            )
        elif wait == "polling":
            waiting = await until_phase(run, "order pending; polling again")
            assert waiting.next_attempt_at is not None  # a 3600 s durable wait
        else:
            waiting = await run.until_active()
        before = len(fakes.calls)
        asked_at = await run.now()

        answer = await run.handle.execute_update("cancel", result_type=CertificateState)
        assert answer.status is CANCELED and answer.phase == "canceled", answer
        result = await run.result()

    assert result.status is CANCELED and result.phase == "canceled"
    assert result.next_attempt_at is None
    expected = ["cancel_certificate"] + (["deactivate_authorizations"] if open_order else [])
    assert fakes.names()[before:] == expected
    assert fakes.of("cancel_certificate")[0].arg == CERT_ID
    if open_order:
        assert fakes.of("deactivate_authorizations")[0].arg == open_order
    assert fakes.row.status is CANCELED and fakes.row.order_url is None
    # Ended at once: the wait was not sat out.
    assert fakes.of("cancel_certificate")[0].at - asked_at < timedelta(minutes=1)
    assert waiting.status is not CANCELED


async def _cancel_during_the_fast_poll(fakes: Fakes, answer: str) -> CertificateState:
    """Send cancel while wait_for_order polls; the poll then answers `answer`."""
    polling = asyncio.Event()
    release = asyncio.Event()

    async def held(index: int, _: WaitForOrderInput) -> Any:
        polling.set()
        await release.wait()
        return OrderProgress(status=AcmeStatus(answer))

    fakes.behaviours["wait_for_order"] = held
    async with started(fakes.env, fakes) as run:
        await asyncio.wait_for(polling.wait(), 15)
        await run.handle.signal("cancel")
        release.set()
        return await run.result()


async def test_cancel_signal_during_the_fast_poll_stops_before_polling_again(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env)
    result = await _cancel_during_the_fast_poll(fakes, answer="pending")

    assert result.status is CANCELED and result.phase == "canceled"
    assert len(fakes.of("wait_for_order")) == 1
    assert "finalize_and_store" not in fakes.names()
    assert [c.arg for c in fakes.of("deactivate_authorizations")] == [order(1).order_url]


async def test_cancel_during_the_fast_poll_does_not_finalize_a_ready_order(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env)
    result = await _cancel_during_the_fast_poll(fakes, answer="ready")

    assert result.status is CANCELED
    assert "finalize_and_store" not in fakes.names(), fakes.names()
    assert fakes.issued == []


async def test_delete_with_revoke_revokes_then_deletes(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        before = len(fakes.calls)
        answer = await run.handle.execute_update(
            "delete", DeleteRequest(revoke=True), result_type=CertificateState
        )
        assert answer.phase == "deleted", answer
        result = await run.result()

    assert result.phase == "deleted"
    assert result.status is CANCELED
    assert fakes.names()[before:] == [
        "cancel_certificate",
        "revoke_certificate",
        "delete_certificate",
    ]
    assert [c.arg for c in fakes.calls[before:]] == [CERT_ID] * 3
    assert fakes.row.deleted


async def test_delete_is_not_done_when_revocation_fails(workflow_env: WorkflowEnvironment) -> None:
    def refused() -> Exception:
        return app_error(ErrorCode.ACME_INVALID_ORDER, "the CA refused the revocation")

    fakes = Fakes(workflow_env, behaviours={"revoke_certificate": fail_first(10, refused)})
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        before = len(fakes.calls)
        answer = await run.handle.execute_update(
            "delete", DeleteRequest(revoke=True), result_type=CertificateState
        )
        result = await run.result()

    assert answer.phase == result.phase == "canceled; not deleted: revocation failed"
    assert result.status is CANCELED
    assert result.error_code is ErrorCode.ACME_INVALID_ORDER
    assert result.error_message == "the CA refused the revocation"
    assert fakes.names()[before:] == ["cancel_certificate", "revoke_certificate"]  # one try
    assert "delete_certificate" not in fakes.names()
    assert not fakes.row.deleted and fakes.row.status is CANCELED


async def test_delete_signal_without_revoke_only_deletes(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        before = len(fakes.calls)
        await run.handle.signal("delete")  # no argument: revoke=False
        result = await run.result()

    assert result.phase == "deleted"
    assert fakes.names()[before:] == ["cancel_certificate", "delete_certificate"]
    assert fakes.row.deleted


async def test_delete_with_revoke_of_a_certificate_never_issued_skips_revocation(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env, policy=SLOW, behaviours={"check_dns": fail_first(1, dns_cname_error)})
    async with started(workflow_env, fakes) as run:
        await until_phase(run, "waiting for DNS to be fixed")
        before = len(fakes.calls)
        answer = await run.handle.execute_update(
            "delete", DeleteRequest(revoke=True), result_type=CertificateState
        )
        result = await run.result()

    assert answer.phase == result.phase == "deleted"
    assert fakes.names()[before:] == ["cancel_certificate", "delete_certificate"]
    assert fakes.row.deleted


async def test_deactivation_failure_does_not_stop_the_cancel(
    workflow_env: WorkflowEnvironment,
) -> None:
    async def pending(_: int, __: WaitForOrderInput) -> OrderProgress:
        return OrderProgress(status=AcmeStatus.PENDING, retry_after_seconds=3600)

    def unreachable() -> Exception:
        return RuntimeError("the CA is unreachable")

    fakes = Fakes(
        workflow_env,
        behaviours={
            "wait_for_order": pending,
            "deactivate_authorizations": fail_first(10, unreachable),
        },
    )
    async with started(workflow_env, fakes) as run:
        await until_phase(run, "order pending; polling again")
        await run.handle.signal("cancel")
        await run.until_calls("deactivate_authorizations", 3, advance=1)
        result = await run.result()

    assert result.status is CANCELED and result.phase == "canceled"
    assert len(fakes.of("deactivate_authorizations")) == 3  # best effort: 3 tries, then on
    assert fakes.row.status is CANCELED


async def test_updates_after_a_stop_are_rejected(workflow_env: WorkflowEnvironment) -> None:
    """While the cancel runs (the cancel activity is held), retry/renew/cancel are
    refused, and a second delete too."""
    release = asyncio.Event()

    async def held(_: int, __: Any) -> Any:
        await release.wait()
        return DEFAULT

    fakes = Fakes(workflow_env, policy=SLOW, behaviours={"check_dns": fail_first(1, dns_cname_error)})
    fakes.behaviours["cancel_certificate"] = held
    async with started(workflow_env, fakes) as run:
        await until_phase(run, "waiting for DNS to be fixed")
        await run.handle.signal("delete", DeleteRequest())
        await run.until_calls("cancel_certificate", 1)
        try:
            for update, arg in (("retry", None), ("renew", None), ("cancel", None)):
                with pytest.raises(Exception) as raised:
                    await run.handle.execute_update(update, result_type=CertificateState)
                assert "canceled" in str(getattr(raised.value, "cause", raised.value)), raised.value
            with pytest.raises(Exception) as raised:
                await run.handle.execute_update(
                    "delete", DeleteRequest(revoke=True), result_type=CertificateState
                )
            assert "already being deleted" in str(getattr(raised.value, "cause", raised.value))
        finally:
            release.set()
        result = await run.result()
    assert result.phase == "deleted"
