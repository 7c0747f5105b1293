"""The scheduled passes' shape on the time-skipping server: a reconcile pass is one
activity with no patch marker (what each firing of its schedule pays for), the
passes of the first UTC hour prune the event log too, and a pass that was in
flight when its worker was replaced by this code finishes on it, whichever step
it was at (the replay of a whole old history is test_replay_scheduled.py)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from certflow.contract import RECONCILE_WORKFLOW, RENEWAL_INFO_SWEEP_WORKFLOW
from certflow.workflow_payloads import ReconcileResult
from workflows.reconcile import ReconcileWorkflow
from workflows.renewal_info_sweep import RenewalInfoSweepWorkflow

from .scheduled_fakes import (
    EveryPassReconcileWorkflow,
    ScheduledFakes,
    activities_scheduled,
    markers,
    skip_to,
    upserts,
    worker,
)

WORKFLOWS: list[type] = [ReconcileWorkflow, RenewalInfoSweepWorkflow]


async def _pass(env: WorkflowEnvironment, workflow_type: str) -> WorkflowHandle[object, object]:
    fakes = ScheduledFakes()
    async with worker(env, fakes, WORKFLOWS) as queue:
        handle: WorkflowHandle[object, object] = await env.client.start_workflow(
            workflow_type, id=f"pass-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        await handle.result()
    return handle


async def test_a_reconcile_pass_is_one_activity_and_records_no_marker(workflow_env: WorkflowEnvironment) -> None:
    """At noon UTC a pass schedules reconcile_certificates only: 11 history events,
    no marker, no upsert; in the first UTC hour prune_events follows, still without
    a marker. The sweep is one activity, its heartbeat timeout 10 minutes.

    Red with the prune after every pass again (two activities at noon), or with
    ``workflow.patched(EVENT_RETENTION_PATCH)`` asked while the pass runs (a marker
    and a TemporalChangeVersion upsert in every pass: two actions each time the
    schedule fires)."""
    await skip_to(workflow_env, 12.0)
    noon = await (await _pass(workflow_env, RECONCILE_WORKFLOW)).fetch_history()
    assert activities_scheduled(noon) == ["reconcile_certificates"]
    assert (markers(noon), upserts(noon), len(noon.events)) == (0, 0, 11)

    sweep = await (await _pass(workflow_env, RENEWAL_INFO_SWEEP_WORKFLOW)).fetch_history()
    assert activities_scheduled(sweep) == ["sweep_renewal_info"]
    scheduled = next(e for e in sweep.events if e.HasField("activity_task_scheduled_event_attributes"))
    assert scheduled.activity_task_scheduled_event_attributes.heartbeat_timeout.ToTimedelta() == timedelta(minutes=10)

    await skip_to(workflow_env, 0.25)
    first_hour = await (await _pass(workflow_env, RECONCILE_WORKFLOW)).fetch_history()
    assert activities_scheduled(first_hour) == ["reconcile_certificates", "prune_events"]
    assert (markers(first_hour), upserts(first_hour)) == (0, 0)


async def _swapped(env: WorkflowEnvironment, held: str) -> WorkflowHandle[object, ReconcileResult]:
    """A pass started at noon by the code before the daily prune, its worker gone
    while ``held`` runs, finished by a worker of this code (no cache: it replays)."""
    fakes = ScheduledFakes(hold={held: asyncio.Event()})
    queue = f"swap-{uuid.uuid4().hex[:8]}"
    await skip_to(env, 12.0)
    async with Worker(env.client, task_queue=queue, activities=fakes.activities()):
        async with Worker(env.client, task_queue=queue, workflows=[EveryPassReconcileWorkflow],
                          max_cached_workflows=0):
            handle: WorkflowHandle[object, ReconcileResult] = await env.client.start_workflow(
                RECONCILE_WORKFLOW, id=f"swap-{uuid.uuid4().hex[:8]}", task_queue=queue,
                result_type=ReconcileResult,
            )
            while held not in fakes.calls:
                await asyncio.sleep(0.05)
        async with Worker(env.client, task_queue=queue, workflows=[ReconcileWorkflow]):
            fakes.hold[held].set()
            await asyncio.wait_for(handle.result(), timeout=30)
    return handle


async def test_a_pass_in_flight_when_its_worker_is_replaced_finishes_on_this_code(
    workflow_env: WorkflowEnvironment,
) -> None:
    """Replaced while reconcile_certificates runs: this code takes the next step and,
    at noon, ends the pass without a prune. Replaced while prune_events runs (the
    old code's marker and prune in its history): this code replays them and ends.

    Red (the run stuck on a non-deterministic workflow task, the wait times out)
    when ``ReconcileWorkflow._prunes`` decides by the hour alone: the second pass's
    history has the prune its replay would not schedule."""
    before_prune = await (await _swapped(workflow_env, "reconcile_certificates")).fetch_history()
    assert activities_scheduled(before_prune) == ["reconcile_certificates"]
    assert markers(before_prune) == 0

    during_prune = await (await _swapped(workflow_env, "prune_events")).fetch_history()
    assert activities_scheduled(during_prune) == ["reconcile_certificates", "prune_events"]
    assert markers(during_prune) == 1
