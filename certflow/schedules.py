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

from certflow.contract import RECONCILE_WORKFLOW, reconcile_schedule_id

def _schedule(task_queue: str, every_seconds: float) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RECONCILE_WORKFLOW, id=reconcile_schedule_id(task_queue), task_queue=task_queue
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=every_seconds))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def install_reconcile_schedule(client: Client, task_queue: str, every_seconds: float) -> None:
    """Create the schedule, or bring an existing one to this interval; idempotent."""
    schedule = _schedule(task_queue, every_seconds)
    schedule_id = reconcile_schedule_id(task_queue)
    try:
        await client.create_schedule(schedule_id, schedule)
    except ScheduleAlreadyRunningError:

        def update(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(schedule_id).update(update)
