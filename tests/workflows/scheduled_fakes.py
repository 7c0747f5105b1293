"""Fakes of the scheduled passes' activities (reconcile, the event-log prune, the
renewal-info sweep), registered under their pinned names, for the workflow tests
and the recorded histories of the Reconcile and RenewalInfoSweep workflows.

``hold`` keeps a fake from returning until the test lets it go (a pass in flight
while its worker is replaced)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from temporalio.common import RetryPolicy

from certflow.activity_payloads import PruneEventsResult
from certflow.contract import RECONCILE_WORKFLOW
from certflow.workflow_payloads import ReconcileInput, ReconcileResult, RenewalInfoSweepResult


@workflow.defn(name=RECONCILE_WORKFLOW)
class EveryPassReconcileWorkflow:
    """The Reconcile workflow as it was before the daily prune (commit 98cb265): the
    prune after every pass, behind the event-retention patch."""

    @workflow.run
    async def run(self, input: ReconcileInput | None = None) -> ReconcileResult:
        result: ReconcileResult = await workflow.execute_activity(
            "reconcile_certificates",
            input,
            start_to_close_timeout=timedelta(hours=4),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
            result_type=ReconcileResult,
        )
        if workflow.patched("event-retention"):
            await workflow.execute_activity(
                "prune_events",
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=RetryPolicy(maximum_attempts=2),
                result_type=PruneEventsResult,
            )
        return result


@dataclass
class ScheduledFakes:
    calls: list[str] = field(default_factory=list)
    hold: dict[str, asyncio.Event] = field(default_factory=dict)
    """Activity name → an event the fake waits for before it returns."""

    async def _enter(self, name: str) -> None:
        self.calls.append(name)
        gate = self.hold.get(name)
        if gate is not None:
            await gate.wait()

    def activities(self) -> list[Callable[..., Any]]:
        @activity.defn(name="reconcile_certificates")
        async def reconcile_certificates(input: ReconcileInput | None = None) -> ReconcileResult:
            await self._enter("reconcile_certificates")
            return ReconcileResult(checked=0, started=[], started_count=0, refused_count=0)

        @activity.defn(name="prune_events")
        async def prune_events() -> PruneEventsResult:
            await self._enter("prune_events")
            return PruneEventsResult(deleted=2, examined=3)

        @activity.defn(name="sweep_renewal_info")
        async def sweep_renewal_info() -> RenewalInfoSweepResult:
            await self._enter("sweep_renewal_info")
            return RenewalInfoSweepResult(asked=3, moved=1)

        return [reconcile_certificates, prune_events, sweep_renewal_info]


async def skip_to(env: WorkflowEnvironment, utc_hour: float) -> datetime:
    """Move the time-skipping server's clock forward to the next ``utc_hour`` of a
    UTC day (0 ≤ utc_hour < 24); returns the server's time then."""
    now = await env.get_current_time()
    day = now.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    target = day + timedelta(hours=utc_hour)
    while target <= now + timedelta(seconds=5):
        target += timedelta(days=1)
    await env.sleep(target - now)
    return await env.get_current_time()


@asynccontextmanager
async def worker(
    env: WorkflowEnvironment, fakes: ScheduledFakes, workflows: list[type], task_queue: str | None = None
) -> AsyncIterator[str]:
    """A worker with ``workflows`` and the fakes; yields its task queue."""
    queue = task_queue or f"scheduled-{uuid.uuid4().hex[:8]}"
    async with Worker(env.client, task_queue=queue, workflows=workflows, activities=fakes.activities()):
        yield queue


def activities_scheduled(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def markers(history: WorkflowHistory) -> int:
    return sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED)


def upserts(history: WorkflowHistory) -> int:
    return sum(
        1 for e in history.events if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    )
