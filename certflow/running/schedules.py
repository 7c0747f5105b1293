"""The Temporal Schedule that runs the Reconcile workflow."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from certflow.contract import (
    RECONCILE_WORKFLOW,
    RENEWAL_INFO_SWEEP_WORKFLOW,
    reconcile_schedule_id,
    renewal_info_sweep_schedule_id,
)


def _schedule(workflow_type: str, schedule_id: str, task_queue: str, every_seconds: float) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(workflow_type, id=schedule_id, task_queue=task_queue),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=every_seconds))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def _install(client: Client, workflow_type: str, schedule_id: str, task_queue: str, every_seconds: float) -> None:
    """Create the schedule, or bring an existing one to this interval; idempotent."""
    schedule = _schedule(workflow_type, schedule_id, task_queue, every_seconds)
    try:
        await client.create_schedule(schedule_id, schedule)
    except ScheduleAlreadyRunningError:

        def update(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(schedule_id).update(update)


async def install_reconcile_schedule(client: Client, task_queue: str, every_seconds: float) -> None:
    """The reconcile pass every ``every_seconds``."""
    await _install(
        client, RECONCILE_WORKFLOW, reconcile_schedule_id(task_queue), task_queue, every_seconds
    )


async def install_renewal_info_schedule(client: Client, task_queue: str, every_seconds: float) -> None:
    """The renewal-info sweep every ``every_seconds``."""
    await _install(
        client,
        RENEWAL_INFO_SWEEP_WORKFLOW,
        renewal_info_sweep_schedule_id(task_queue),
        task_queue,
        every_seconds,
    )
