"""Hostnames that were never finished, hostnames left behind, and transfers between
tenants, on the time-skipping test server."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, Phase
from certflow.workflow_payloads import CertificateState, TransferRequest

from .fakes import FAST_POLICY, Fakes, active_row, app_error, dns_cname_error, fail_first, started

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
