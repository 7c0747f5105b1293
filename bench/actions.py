"""Temporal's bill counted from the server: every history event of every run, by
type, and the dev server's own ``action`` counter (its ``/metrics`` endpoint)."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus

E = EventType
ACTION_KINDS = ("workflow_starts", "workflow_tasks", "activity_tasks", "timers", "signals", "child_workflows")
"""What ``actions`` sums: workflow tasks included."""
BILLABLE_KINDS = (
    "workflow_starts", "activity_tasks", "timers", "signals", "child_workflows",
    "search_attribute_upserts", "marker_batches",
)
"""What ``billable`` sums: Temporal Cloud's actions as the server's ``action`` metric
counts them (no workflow tasks; upserts; the markers of one workflow task once),
heartbeats aside (they are not in histories)."""
_WFT_DONE = (
    E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    E.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
)
_SIMPLE = {
    E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "workflow_starts",
    E.EVENT_TYPE_TIMER_STARTED: "timers",
    E.EVENT_TYPE_TIMER_FIRED: "timers_fired",
    E.EVENT_TYPE_TIMER_CANCELED: "timers_canceled",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signals",
    E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "child_workflows",
    E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "search_attribute_upserts",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued_as_new",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "updates",
    E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activities_scheduled",
}


def ts(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


def tally(events: Iterable[HistoryEvent]) -> Counter[str]:
    """Events by kind; ``activity_tasks`` counts attempts, ``actions`` sums ACTION_KINDS."""
    found: Counter[str] = Counter()
    marker_batch_open = False
    for ev in events:
        found["events"] += 1
        kind = ev.event_type
        if kind == E.EVENT_TYPE_MARKER_RECORDED:
            found["markers"] += 1
            if marker_batch_open:
                found["marker_batches"] += 1
                marker_batch_open = False
        if kind in _WFT_DONE:
            found["workflow_tasks"] += 1
            marker_batch_open = True
        elif kind == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            found["activity_tasks"] += max(1, ev.activity_task_started_event_attributes.attempt)
        elif kind in _SIMPLE:
            found[_SIMPLE[kind]] += 1
    found["actions"] = sum(found[k] for k in ACTION_KINDS)
    found["billable"] = sum(found[k] for k in BILLABLE_KINDS)
    return found


def split_at_activity(events: list[HistoryEvent], name: str) -> tuple[list[HistoryEvent], list[HistoryEvent]]:
    """(events before the first ``name`` activity is scheduled, the rest)."""
    for i, ev in enumerate(events):
        if (
            ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and ev.activity_task_scheduled_event_attributes.activity_type.name == name
        ):
            return events[:i], events[i:]
    return events, []


_PARKED_LAST = (
    E.EVENT_TYPE_TIMER_STARTED,
    E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
)


def holds_timer(events: list[HistoryEvent]) -> bool:
    """A timer started and neither fired nor canceled: the run is parked on it."""
    open_timers: set[int] = set()
    for ev in events:
        if ev.event_type == E.EVENT_TYPE_TIMER_STARTED:
            open_timers.add(ev.event_id)
        elif ev.event_type == E.EVENT_TYPE_TIMER_FIRED:
            open_timers.discard(ev.timer_fired_event_attributes.started_event_id)
        elif ev.event_type == E.EVENT_TYPE_TIMER_CANCELED:
            open_timers.discard(ev.timer_canceled_event_attributes.started_event_id)
    return bool(open_timers)


@dataclass
class RunTally:
    workflow_id: str
    run_id: str
    workflow_type: str
    status: WorkflowExecutionStatus | None
    started_at: float
    total: Counter[str]
    in_window: Counter[str]
    parked: bool
    """Running, holding a timer, nothing after its last workflow task (no task or
    activity pending)."""
    events: list[HistoryEvent] | None = field(default=None, repr=False)


async def read_all(
    client: Client,
    window: tuple[float, float],
    keep_events: Callable[[str], bool],
    concurrency: int = 24,
) -> list[RunTally]:
    """Every run in the namespace with its history tallied, in total and for the
    events inside ``window`` (epoch seconds, server clock = this machine's)."""
    executions = [e async for e in client.list_workflows()]
    gate = asyncio.Semaphore(concurrency)
    since, until = window

    async def one(ex_id: str, run_id: str, wf_type: str, status: WorkflowExecutionStatus | None,
                  started: float) -> RunTally:
        async with gate:
            history = await client.get_workflow_handle(ex_id, run_id=run_id).fetch_history()
        events = list(history.events)
        last = events[-1].event_type if events else None
        parked = (
            status == WorkflowExecutionStatus.RUNNING
            and holds_timer(events)
            and last in _PARKED_LAST
        )
        return RunTally(
            ex_id, run_id, wf_type, status, started, tally(events),
            tally(e for e in events if since <= ts(e) < until), parked,
            events if keep_events(ex_id) else None,
        )

    return list(await asyncio.gather(*(
        one(e.id, e.run_id, e.workflow_type, e.status, e.start_time.timestamp()) for e in executions
    )))


HEARTBEAT = "grpc_RecordActivityTaskHeartbeat"
"""The ``action_type`` of a heartbeat the server recorded (billable; not in histories)."""

_ACTION_LINE = re.compile(r'^action\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def action_metric(port: int) -> Counter[str]:
    """The dev server's ``action`` counter (what Temporal bills as actions: starts,
    signals, commands such as StartTimer and ScheduleActivityTask, heartbeats...),
    keyed ``namespace/action_type``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: Counter[str] = Counter()
    for line in text.splitlines():
        match = _ACTION_LINE.match(line)
        if match:
            labels = dict(_LABEL.findall(match["labels"]))
            found[f"{labels.get('namespace', '?')}/{labels.get('action_type', '?')}"] += int(float(match["value"]))
    return found


def counter_delta(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0)}


def summed(tallies: Iterable[Counter[str]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for t in tallies:
        total.update(t)
    return total
