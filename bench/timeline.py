"""Where one issuance's time goes, event by event: K single issuances one after
another on one deployment; each history event stamped from the moment just
before ``CertflowClient.request``, the median per event over the issuances whose
histories have the same shape, and the step from the event before.

The server's timestamps say when it recorded each event: a workflow task's
schedule-to-start is the server's dispatch, its start-to-complete the worker's
activation and the completion's round trip, an activity's start-to-complete the
activity itself (ACME, Postgres, DNS).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType

from bench.certflow_run import ISSUE_ENV, Watcher, issue
from bench.deploy import deploy
from bench.stack import Stack
from bench.temporal_util import event_seconds, fetch_runs, to_renewal_wait, wait_quiet
from certflow.contract import workflow_id_for

_PREFIX = "EVENT_TYPE_"


async def run_timeline(
    stack: Stack, count: int, workdir: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """``count`` sequential issuances after one warm-up; the median timeline."""
    dep = await deploy(stack, workdir, "timeline", ISSUE_ENV)
    try:
        watcher = Watcher(dep)
        [warm] = dep.new_hostnames("warm", 1)
        await issue(dep, watcher, [warm], 60, 0.01)
        await wait_quiet(dep.client.temporal, [workflow_id_for(warm)], 30)
        timelines: list[tuple[tuple[str, ...], list[float], float]] = []
        for i in range(count):
            [name] = dep.new_hostnames(f"t{i}", 1)
            batch = await issue(dep, watcher, [name], 60, 0.01)
            await wait_quiet(dep.client.temporal, [workflow_id_for(name)], 30, pause=0.02)
            runs = await fetch_runs(dep.client.temporal, {workflow_id_for(name)})
            issuing: list[Any] = []
            for run in runs[workflow_id_for(name)]:
                before, parked = to_renewal_wait(run.events)
                issuing.extend(before or parked)
            shape = tuple(EventType.Name(e.event_type).removeprefix(_PREFIX) for e in issuing)
            offsets = [1000 * (event_seconds(e) - batch.requested) for e in issuing]
            active = batch.active_at.get(name)
            if active is not None:
                timelines.append((shape, offsets, 1000 * (active - batch.requested)))
        found = summarize_timelines(timelines)
        found["worker_log_levels"] = dep.worker_log_levels()
        log(f"  {found['matching']} of {count} issuances share the commonest shape")
        return found
    finally:
        await dep.close()


def summarize_timelines(
    timelines: list[tuple[tuple[str, ...], list[float], float]],
) -> dict[str, Any]:
    """Median offset (ms) per event of the commonest event sequence, and of ACTIVE."""
    if not timelines:
        return {"count": 0, "matching": 0, "events": [], "active_ms": None}
    shape, _ = Counter(t[0] for t in timelines).most_common(1)[0]
    same = [t for t in timelines if t[0] == shape]
    events = []
    previous = 0.0
    for index, kind in enumerate(shape):
        median = statistics.median(t[1][index] for t in same)
        events.append({"event": kind, "median_ms": round(median, 1), "step_ms": round(median - previous, 1)})
        previous = median
    return {
        "count": len(timelines),
        "matching": len(same),
        "events": events,
        "active_ms": round(statistics.median(t[2] for t in same), 1),
    }


def table(found: dict[str, Any]) -> str:
    """The timeline as text: event, median ms since the request, step from the one before."""
    lines = [f"{'event':40s} {'ms':>8s} {'step':>8s}"]
    for row in found["events"]:
        lines.append(f"{row['event']:40s} {row['median_ms']:8.1f} {row['step_ms']:+8.1f}")
    lines.append(
        f"row ACTIVE (median) {found['active_ms']} ms; {found['matching']} of {found['count']}"
        " issuances share this shape"
    )
    return "\n".join(lines)
