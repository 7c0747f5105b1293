"""Hostnames that were never finished, hostnames left behind, and transfers between
tenants, on the time-skipping test server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, Phase
from certflow.workflow_payloads import CertificateState, TransferRequest

from .fakes import DEFAULT, FAST_POLICY, Fakes, Run, active_row, app_error, dns_cname_error, fail_first, started

async def test_a_hostname_never_ready_is_abandoned_after_the_timeout(workflow_env: WorkflowEnvironment) -> None:
    """No validation method ready for pending_timeout_days: CANCELED with ABANDONED, a
    webhook said so (give_up), the workflow ended; nothing was ever ordered.

    Shown red: with ``_given_up`` never abandoning a PENDING row, the workflow kept
    re-checking and its result never came (the 60 s wait timed out)."""
    policy = FAST_POLICY.model_copy(
        update={"pending_timeout_days": 2, "dns_recheck_initial_seconds": 3600, "dns_recheck_max_seconds": 6 * 3600}
    )
    fakes = Fakes(workflow_env, policy=policy, behaviours={"check_dns": fail_first(10**6, dns_cname_error)})
    async with started(workflow_env, fakes) as run:
        await run.until(lambda s: s.error_code is ErrorCode.DNS_CNAME, "the DNS wait")
        started_at = fakes.of("check_dns")[0].at
        result = await asyncio.wait_for(run.handle.result(), 60)
        assert result.status is CertificateStatus.CANCELED and result.phase == Phase.ABANDONED
        assert result.error_code is ErrorCode.ABANDONED
        (gave_up,) = fakes.of("give_up")
        assert gave_up.arg.code is ErrorCode.ABANDONED and gave_up.arg.status is CertificateStatus.CANCELED
        assert timedelta(days=2) <= gave_up.at - started_at < timedelta(days=2, hours=7)
        assert fakes.of("place_order") == []
        assert fakes.row.status is CertificateStatus.CANCELED


async def test_a_hostname_that_left_expires_departed_and_stops_after_the_retention(
    workflow_env: WorkflowEnvironment,
) -> None:
    """An ACTIVE certificate whose hostname stops routing to us: its renewal keeps
    failing DNS_CNAME, it is served until it expires, then EXPIRED with DEPARTED (a
    webhook), re-checked (still DEPARTED) until departed_retention_days, then the
    workflow ends; nothing was ordered."""
    t0 = await workflow_env.get_current_time()
    policy = FAST_POLICY.model_copy(
        update={"departed_retention_days": 3, "dns_recheck_initial_seconds": 3600, "dns_recheck_max_seconds": 12 * 3600}
    )
    fakes = Fakes(
        workflow_env,
        policy=policy,
        row=active_row(t0, timedelta(days=20)),
        behaviours={"check_dns": fail_first(10**6, dns_cname_error)},
    )
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        result = await asyncio.wait_for(run.handle.result(), 60)
        assert result.status is CertificateStatus.EXPIRED and result.phase == Phase.DEPARTED
        (gave_up,) = fakes.of("give_up")
        assert gave_up.arg.code is ErrorCode.DEPARTED and gave_up.arg.status is CertificateStatus.EXPIRED
        assert gave_up.at >= t0 + timedelta(days=20)
        assert fakes.row.error_code is ErrorCode.DEPARTED  # re-checks kept saying so
        last = fakes.of("check_dns")[-1].at
        assert timedelta(days=3) <= last - gave_up.at < timedelta(days=4)
        assert fakes.of("place_order") == []


async def test_a_transfer_moves_the_hostname_and_renews_with_a_new_key(workflow_env: WorkflowEnvironment) -> None:
    """The ``transfer`` update: refused (nothing changed) without the new tenant's
    proof; with it, the row's tenant changes, both tenants are told, and the ACTIVE
    certificate is renewed at once (a new order, a new key) — the old one served
    until then."""
    t0 = await workflow_env.get_current_time()
    row = active_row(t0, timedelta(days=90))
    row.tenant_id = "old"
    unproven = app_error(ErrorCode.OWNERSHIP_UNVERIFIED, 'add _certflow.x.test TXT "tok"')
    fakes = Fakes(
        workflow_env,
        row=row,
        behaviours={"transfer_certificate": fail_first(1, lambda: unproven)},
    )
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        with pytest.raises(WorkflowUpdateFailedError):
            await run.handle.execute_update("transfer", TransferRequest(to_tenant="new"), result_type=CertificateState)
        assert fakes.row.tenant_id == "old" and fakes.of("begin_renewal") == []
        await run.handle.execute_update("transfer", TransferRequest(to_tenant="new"), result_type=CertificateState)
        assert fakes.row.tenant_id == "new"
        await run.until_active(serial_count=1)
        assert len(fakes.of("begin_renewal")) == 1 and len(fakes.of("place_order")) == 1
        await run.cancel()


async def handing_over_after_issuance(
    workflow_env: WorkflowEnvironment,
    transfer_refused: bool,
    renew_signal: bool,
    keep: Callable[[Run], Awaitable[None]] | None = None,
) -> tuple[Fakes, list[timedelta]]:
    """Issue a hostname with a transfer in flight, its ``transfer_certificate`` held
    until the run has stored the certificate and waits (phase ISSUED) for the
    transfer's handler before it hands over; then, with ``renew_signal``, signal
    ``renew`` in that phase. Returns the fakes and, for each renewal begun, how long
    after the issuance it began (virtual time: the next run waits ~60 days when
    nothing asked it to renew). ``keep`` is handed the run before it is canceled
    (record_patch_histories.py records its histories)."""
    store_may_finish, transfer_may_finish = asyncio.Event(), asyncio.Event()

    async def held_store(index: int, _: object) -> object:
        if index == 0:
            await store_may_finish.wait()
        return DEFAULT

    async def held_transfer(index: int, _: object) -> object:
        await transfer_may_finish.wait()
        if transfer_refused:
            raise app_error(ErrorCode.OWNERSHIP_UNVERIFIED, 'add _certflow.x.test TXT "tok"')
        return DEFAULT

    fakes = Fakes(
        workflow_env,
        behaviours={"finalize_and_store": held_store, "transfer_certificate": held_transfer},
    )
    async with started(workflow_env, fakes) as run:
        await run.until_calls("finalize_and_store", 1)
        transfer = await run.handle.start_update(
            "transfer",
            TransferRequest(to_tenant="new"),
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            result_type=CertificateState,
        )
        await run.until_calls("transfer_certificate", 1)
        store_may_finish.set()
        await run.until(lambda s: s.phase == Phase.ISSUED, "the ISSUED phase")
        if renew_signal:
            await run.handle.signal("renew")
        transfer_may_finish.set()
        if transfer_refused:
            with pytest.raises(WorkflowUpdateFailedError):
                await transfer.result()
        else:
            await transfer.result()
        await run.until_active(serial_count=2, advance=timedelta(days=1), timeout=120)
        issued = fakes.issued[0].issued_at
        assert issued is not None
        begun = [call.at - issued for call in fakes.of("begin_renewal")]
        if keep is not None:
            await keep(run)
        await run.cancel()
    return fakes, begun


async def test_a_transfer_that_ends_while_the_run_hands_over_still_renews(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A transfer whose ownership check ends after the certificate was stored, in the
    phase where the run answers its handlers and hands over to the run that waits for
    the renewal time: that next run renews at once with a new key (the transfer's
    promise), not at the renewal time ~60 days on.

    Shown red: with ``_renew_when_active`` setting ``renew_requested`` in the ISSUED
    phase too (as before RENEW_NEXT_RUN_PATCH), the request was cleared with the
    run's other requests: the renewal came at the renewal time (begun 56 days
    after the issuance) and the assertion below failed."""
    fakes, begun = await handing_over_after_issuance(workflow_env, transfer_refused=False, renew_signal=False)
    assert fakes.row.tenant_id == "new"
    assert len(begun) == 1 and begun[0] < timedelta(hours=1), begun


async def test_a_renew_signal_while_the_run_hands_over_renews_in_the_next_run(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A ``renew`` signal that reaches the run which has just issued (phase ISSUED,
    held there by a transfer in flight that is then refused): the next run renews
    at once. The refused transfer changes nothing.

    Shown red: as above, with the signal setting ``renew_requested`` in the ISSUED
    phase, the renewal began only at the renewal time (54 days on)."""
    fakes, begun = await handing_over_after_issuance(workflow_env, transfer_refused=True, renew_signal=True)
    assert fakes.row.tenant_id is None
    assert len(begun) == 1 and begun[0] < timedelta(hours=1), begun
