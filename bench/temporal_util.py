"""Reading certflow's workflows back from Temporal: are they parked yet, and
what did their histories cost (events, workflow tasks, task latencies)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from bench.actions import BILLABLE_KINDS, tally
from bench.stats import percentile
from certflow.contract import CERTIFICATE_WORKFLOW


async def _bounded(coros: Iterable[Any], concurrency: int) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def one(coro: Any) -> Any:
        async with gate:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


async def is_quiet(client: Client, workflow_id: str) -> bool:
    """Running with no pending activity and no pending workflow task: blocked on a
    timer or condition (for certflow: the renewal wait)."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    raw = desc.raw_description
    return (
        desc.status == WorkflowExecutionStatus.RUNNING
        and not raw.pending_activities
        and not raw.HasField("pending_workflow_task")
    )


async def wait_quiet(
    client: Client, workflow_ids: list[str], timeout: float, concurrency: int = 24, pause: float = 0.05
) -> list[str]:
    """Wait until every workflow is quiet; returns the ones that never got there."""
    waiting = list(workflow_ids)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        quiet = await _bounded((is_quiet(client, w) for w in waiting), concurrency)
        waiting = [w for w, q in zip(waiting, quiet) if not q]
        if waiting:
            await asyncio.sleep(pause if len(waiting) < 10 else 1.0)
    return waiting


@dataclass
class Run:
    workflow_id: str
    run_id: str
    status: WorkflowExecutionStatus | None
    events: list[HistoryEvent]


async def fetch_runs(
    client: Client, workflow_ids: set[str], timeout: float = 20.0
) -> dict[str, list[Run]]:
    """Every run of each workflow (via the visibility list), with its history: once
    each workflow's list holds a running run and the run each listed run continued
    as new into (visibility lags a moment behind a continue-as-new)."""

    async def history(workflow_id: str, run_id: str, status: WorkflowExecutionStatus | None) -> Run:
        fetched = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        return Run(workflow_id, run_id, status, list(fetched.events))

    deadline = time.monotonic() + timeout
    while True:
        listed: dict[str, list[tuple[str, WorkflowExecutionStatus | None]]] = defaultdict(list)
        async for execution in client.list_workflows(f'WorkflowType="{CERTIFICATE_WORKFLOW}"'):
            if execution.id in workflow_ids:
                listed[execution.id].append((execution.run_id, execution.status))
        pairs = [(w, r, s) for w, runs in listed.items() for r, s in runs]
        fetched = await _bounded((history(w, r, s) for w, r, s in pairs), 16)
        result: dict[str, list[Run]] = defaultdict(list)
        for run in fetched:
            result[run.workflow_id].append(run)
        if all(_complete(result.get(w, [])) for w in workflow_ids) or time.monotonic() > deadline:
            return dict(result)
        await asyncio.sleep(0.5)


def _complete(runs: list[Run]) -> bool:
    """A running run listed, and every run continued as new into is listed."""
    ids = {r.run_id for r in runs}
    continued = [
        r.events[-1].workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        for r in runs
        if r.events and r.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    ]
    return any(r.status == WorkflowExecutionStatus.RUNNING for r in runs) and all(c in ids for c in continued)


def event_seconds(event: HistoryEvent) -> float:
    """When the server recorded the event (epoch seconds)."""
    return event.event_time.seconds + event.event_time.nanos / 1e9


_ACTIVITY_END = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
}


def breakdown(events: list[HistoryEvent]) -> dict[str, float]:
    """Where one run's time went (seconds) and what it cost (counts).

    ``wft_queue``: workflow task schedule-to-start; ``wft_run``: start-to-complete
    (worker + round trips); ``act_queue:X`` / ``act_run:X``: the same for activity X.
    """
    out: dict[str, float] = defaultdict(float)
    scheduled: dict[int, tuple[float, str]] = {}
    started: dict[int, float] = {}
    for ev in events:
        t, kind = event_seconds(ev), ev.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled[ev.event_id] = (t, "wft")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            attrs = ev.workflow_task_started_event_attributes
            out["wft_queue"] += t - scheduled.get(attrs.scheduled_event_id, (t, ""))[0]
            started[ev.event_id] = t
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            attrs_c = ev.workflow_task_completed_event_attributes
            out["wft_run"] += t - started.get(attrs_c.started_event_id, t)
            out["count:workflow_tasks"] += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = ev.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[ev.event_id] = (t, name)
            out[f"count:activity:{name}"] += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs_s = ev.activity_task_started_event_attributes
            when, name = scheduled.get(attrs_s.scheduled_event_id, (t, "?"))
            out[f"act_queue:{name}"] += t - when
            out["count:activity_attempts"] += attrs_s.attempt
            started[ev.event_id] = t
        elif kind in _ACTIVITY_END:
            attrs_e = getattr(ev, _ACTIVITY_END[kind])
            name = scheduled.get(attrs_e.scheduled_event_id, (t, "?"))[1]
            out[f"act_run:{name}"] += t - started.get(attrs_e.started_event_id, t)
        elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
            out["count:timers"] += 1
    if events:
        out["total"] = event_seconds(events[-1]) - event_seconds(events[0])
    out["count:events"] = len(events)
    return dict(out)


def _medians(rows: list[dict[str, float]], digits: int = 4) -> dict[str, float | None]:
    keys = sorted({k for row in rows for k in row})
    medians = {k: percentile([row.get(k, 0.0) for row in rows], 50) for k in keys}
    return {k: None if v is None else round(v, digits) for k, v in medians.items()}


def to_renewal_wait(events: list[HistoryEvent]) -> tuple[list[HistoryEvent], list[HistoryEvent]]:
    """A running run's events split where it starts to wait for the renewal: at its
    last timer, when the run itself issued (a run kept after its issuance); all
    parked otherwise."""
    issued = any(
        e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "finalize_and_store"
        for e in events
    )
    timers = [i for i, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    if not issued or not timers:
        return [], events
    return events[: timers[-1]], events[timers[-1] :]


def summarize(runs: dict[str, list[Run]]) -> dict[str, Any]:
    """Events per certificate up to ACTIVE (the runs that ended in continue-as-new
    after issuing, and a run kept after its issuance up to its renewal wait) and in
    the parked run (from that wait), with median time breakdowns."""
    issuing: list[dict[str, float]] = []
    parked: list[dict[str, float]] = []
    events_to_active: list[float] = []
    billable_to_active: list[float] = []
    for workflow_runs in runs.values():
        closed = [r.events for r in workflow_runs if r.status != WorkflowExecutionStatus.RUNNING]
        running = [
            to_renewal_wait(r.events) for r in workflow_runs if r.status == WorkflowExecutionStatus.RUNNING
        ]
        to_active = closed + [before for before, _ in running if before]
        events_to_active.append(float(sum(len(events) for events in to_active)))
        counted = tally(e for events in to_active for e in events)
        billable_to_active.append(float(sum(counted[k] for k in BILLABLE_KINDS)))
        issuing.extend(breakdown(events) for events in to_active)
        parked.extend(breakdown(after) for _, after in running)
    return {
        "certificates": len(runs),
        "runs": sum(len(v) for v in runs.values()),
        "events_per_cert_to_active": percentile(events_to_active, 50),
        "events_per_cert_to_active_max": max(events_to_active) if events_to_active else None,
        # Temporal Cloud's actions in those runs, heartbeats aside (not in histories).
        "billable_actions_per_cert_to_active": percentile(billable_to_active, 50),
        "events_per_cert_parked_run": _medians(parked).get("count:events"),
        "issuing_run_median": _medians(issuing),
        "issuing_run_p95_total": percentile([r.get("total", 0.0) for r in issuing], 95),
        "parked_run_median": _medians(parked),
    }
