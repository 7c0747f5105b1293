"""The schedules' bill: what each firing of the reconcile and renewal-info sweep
schedules costs, read off the Temporal server's own ``action`` counter, and what
that makes per hour and per certificate-year.

One deployment on product defaults (the intervals read back from the installed
schedules), its CA Pebble behind the fault proxy serving ARI (Retry-After 12 h),
K certificates issued and parked. Then each schedule alone (the other paused: a
paused schedule records nothing): F firings, each measured from LEAD seconds
before its nominal time until its run closed and the scheduler recorded it, every
counter kind of the ``default`` namespace. Before each sweep firing every parked
certificate's next ARI check is made due, as at any real scale, where every sweep
finds some. Each run's history is tallied too (bench/actions.py), so the counter
splits into the scheduler's own commands (its timer, memo, marker batch), the
run's start, what the history holds and the heartbeats (not in histories).

Costs per firing do not depend on N (a sweep's heartbeats aside, which follow its
length: docs/performance.md); the per-certificate-year figures divide by N.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from temporalio.client import ScheduleHandle, WorkflowExecutionStatus

from bench.actions import HEARTBEAT, E, action_metric, counter_delta, tally
from bench.deploy import Deployment, deploy
from bench.stack import Stack
from bench.temporal_util import wait_quiet
from certflow.contract import reconcile_schedule_id, renewal_info_sweep_schedule_id, workflow_id_for
from devstack import servers
from devstack.faultproxy import start_fault_proxy

Log = Callable[[str], None]
TENANT = "bench-schedules"
ARI_RETRY_AFTER = 43200
LEAD = 10.0
"""Seconds before a firing's nominal time the counter is read."""
SETTLE = 6.0
"""Seconds after the run closed before the counter is read again (the scheduler
records the close; the metric lags its RPCs a moment)."""
BENCH_ONLY = ("grpc_PatchSchedule", "grpc_DescribeSchedule", "grpc_ListSchedules")
SCHEDULER_KINDS = ("command_StartTimer", "command_ModifyWorkflowProperties")
"""Commands only the scheduler's own workflow records here (the passes start no
timers and change no memo); its marker batch (the counter's less the run's, from
its history) is the third."""
CYCLES_PER_YEAR = 365.0 / 60.0
CYCLE_BILLABLE = 5.99
"""Billable actions of one renewal cycle, heartbeat included, counted from every
history and checked against the server's counter (docs/performance.md)."""
CLOUD_SCHEDULE_EXECUTION = 3
"""What Temporal Cloud bills for one execution of a schedule, the workflow start
included (docs.temporal.io, "Temporal Cloud Actions": Schedules). The dev
server's counter instead counts the commands of its scheduler workflow."""
PER_CERT = (100_000, 1_000_000)
HOURS_PER_YEAR = 8760.0


async def _schedules_installed(dep: Deployment, ids: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for schedule_id in ids:
        while True:
            try:
                await dep.client.temporal.get_schedule_handle(schedule_id).describe()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def _interval(handle: ScheduleHandle) -> float:
    spec = (await handle.describe()).schedule.spec
    return spec.intervals[0].every.total_seconds()


async def _issue(dep: Deployment, count: int, log: Log) -> list[str]:
    names = dep.new_hostnames("sched", count)
    await dep.client.request(names, tenant_id=TENANT)
    deadline = time.monotonic() + 300
    while True:
        active = int(await dep.watch.fetchval(
            "SELECT count(*) FROM certificates WHERE tenant_id = $1 AND status = 'ACTIVE'", TENANT
        ))
        if active >= count:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"schedules: {active}/{count} certificates ACTIVE after 300 s")
        await asyncio.sleep(0.5)
    not_quiet = await wait_quiet(dep.client.temporal, [workflow_id_for(n) for n in names], 120)
    log(f"  schedules: {count} certificates issued and parked ({len(not_quiet)} not quiet)")
    return names


def _counter(port: int) -> Counter[str]:
    return Counter({k.split("/", 1)[1]: v for k, v in action_metric(port).items() if k.startswith("default/")})


async def _firing(dep: Deployment, handle: ScheduleHandle, port: int, sweep: bool, log: Log) -> dict[str, Any]:
    """One firing of ``handle``'s schedule, measured."""
    while True:
        desc = await handle.describe()
        nominal = desc.info.next_action_times[0]
        wait = (nominal - datetime.datetime.now(datetime.timezone.utc)).total_seconds() - LEAD
        if wait >= 0:
            break
        await asyncio.sleep(wait + 2 * LEAD)  # too close to read before it: the next one
    if sweep:  # every parked certificate due at this sweep, as at scale
        await dep.watch.execute(
            "UPDATE certificates SET ari_next_check_at = now() WHERE tenant_id = $1", TENANT
        )
    await asyncio.sleep(wait)
    before = await asyncio.to_thread(_counter, port)
    while True:
        recent = [a for a in (await handle.describe()).info.recent_actions if a.scheduled_at >= nominal]
        if recent:
            break
        await asyncio.sleep(0.5)
    action = recent[0].action
    run = dep.client.temporal.get_workflow_handle(
        action.workflow_id, run_id=action.first_execution_run_id  # type: ignore[attr-defined]
    )
    while (await run.describe()).status == WorkflowExecutionStatus.RUNNING:
        await asyncio.sleep(0.5)
    await asyncio.sleep(SETTLE)
    after = await asyncio.to_thread(_counter, port)
    delta = {k: v for k, v in counter_delta(before, after).items() if k not in BENCH_ONLY}
    history = list((await run.fetch_history()).events)
    counted = tally(history)
    # TemporalChangeVersion upserts (a patch's), which Temporal Cloud does not bill.
    version_upserts = sum(
        1 for e in history
        if e.event_type == E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        and set(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
        == {"TemporalChangeVersion"}
    )
    activities = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history if e.activity_task_scheduled_event_attributes.activity_type.name
    ]
    log(f"    {nominal:%H:%M:%S} {sum(delta.values())} actions: {delta}; history: {activities},"
        f" {counted['billable']} billable")
    return {
        "nominal": nominal.isoformat(),
        "workflow_id": action.workflow_id,  # type: ignore[attr-defined]
        "counter": delta,
        "counter_total": sum(delta.values()),
        "history": {**{k: counted[k] for k in ("events", "billable", "workflow_starts", "activity_tasks",
                                               "marker_batches", "search_attribute_upserts", "timers")},
                    "change_version_upserts": version_upserts},
        "activities": activities,
    }


def _mean(firings: list[dict[str, Any]], key: str) -> dict[str, float]:
    kinds = sorted({k for f in firings for k in f[key]})
    return {k: round(sum(f[key].get(k, 0) for f in firings) / len(firings), 3) for k in kinds}


def summarize_schedule(name: str, interval: float, firings: list[dict[str, Any]]) -> dict[str, Any]:
    counter = _mean(firings, "counter")
    history = _mean(firings, "history")
    total = sum(counter.values())
    scheduler = sum(counter.get(k, 0) for k in SCHEDULER_KINDS) + (
        counter.get("command_BatchMarkers", 0) - history.get("marker_batches", 0)
    )
    own = history.get("billable", 0) - history.get("workflow_starts", 0)
    split = {
        "scheduler": scheduler,
        "start": counter.get("grpc_StartWorkflowExecution", 0),
        "in history": own,
        "heartbeats": counter.get(HEARTBEAT, 0),
    }
    split["other"] = total - sum(split.values())
    per_hour = 3600.0 / interval
    # Temporal Cloud's price of the same firing, as its documentation states it: three
    # for a schedule's execution (two, and the workflow it starts), the run's billable
    # events but TemporalChangeVersion upserts, and the heartbeats.
    cloud = CLOUD_SCHEDULE_EXECUTION + own - history.get("change_version_upserts", 0) + split["heartbeats"]
    prunes = any("prune_events" in f["activities"] for f in firings)
    return {
        "schedule": name,
        "interval_seconds": interval,
        "firings": firings,
        "per_firing_counter": counter,
        "per_firing_total": round(total, 3),
        "per_firing_history": history,
        "per_firing_split": {k: round(v, 3) for k, v in split.items()},
        "every_pass_prunes": prunes,
        "firings_per_hour": per_hour,
        "per_hour": round(total * per_hour, 2),
        "cloud_per_firing": round(cloud, 3),
        "cloud_per_hour": round(cloud * per_hour, 2),
    }


def bill(schedules: list[dict[str, Any]], prune_passes_per_day: float) -> dict[str, Any]:
    """Per hour and per certificate-year; ``prune_passes_per_day``: reconcile passes
    that also prune but were not among the firings measured (one activity each)."""
    per_hour = sum(s["per_hour"] for s in schedules) + prune_passes_per_day / 24.0
    cloud = sum(s["cloud_per_hour"] for s in schedules) + prune_passes_per_day / 24.0
    cycle = CYCLES_PER_YEAR * CYCLE_BILLABLE
    return {
        "prune_passes_per_day_added": prune_passes_per_day,
        "per_hour": round(per_hour, 2),
        "cloud_per_hour": round(cloud, 2),
        "per_cert_year": {
            str(n): {"schedules": round(per_hour * HOURS_PER_YEAR / n, 2),
                     "with_the_cycle": round(cycle + per_hour * HOURS_PER_YEAR / n, 2),
                     "cloud_schedules": round(cloud * HOURS_PER_YEAR / n, 2),
                     "cloud_with_the_cycle": round(cycle + cloud * HOURS_PER_YEAR / n, 2)}
            for n in PER_CERT
        },
        "cycle_per_cert_year": round(cycle, 2),
    }


async def run_schedules(
    stack: Stack, count: int, firings: int, workdir_name: str, extra_env: dict[str, str], log: Log = print
) -> dict[str, Any]:
    proxy = await asyncio.to_thread(start_fault_proxy, stack.pebble, stack.workdir / f"pebble-{uuid.uuid4().hex[:4]}")
    try:
        now = datetime.datetime.now(datetime.timezone.utc)
        proxy.serve_renewal_info(now + datetime.timedelta(days=30), now + datetime.timedelta(days=32),
                                 retry_after=str(ARI_RETRY_AFTER))
        port = servers.free_port()
        dep = await deploy(stack, stack.workdir / workdir_name, workdir_name,
                           {"CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url, **extra_env},
                           ["--metrics-port", str(port)])
        try:
            temporal = dep.client.temporal
            ids = {"reconcile": reconcile_schedule_id(dep.task_queue),
                   "renewal_info_sweep": renewal_info_sweep_schedule_id(dep.task_queue)}
            await _schedules_installed(dep, list(ids.values()))
            handles = {k: temporal.get_schedule_handle(v) for k, v in ids.items()}
            for handle in handles.values():
                await handle.pause(note="bench: schedules phase")
            await _issue(dep, count, log)
            found = []
            for name in ("renewal_info_sweep", "reconcile"):
                handle = handles[name]
                interval = await _interval(handle)
                log(f"  schedules: {name} alone, every {interval:g} s, {firings} firing(s)")
                await handle.unpause(note="bench: measured alone")
                await asyncio.sleep(3)
                measured = [await _firing(dep, handle, port, name == "renewal_info_sweep", log)
                            for _ in range(firings)]
                await handle.pause(note="bench: measured")
                found.append(summarize_schedule(name, interval, measured))
            reconcile = found[1]
            # The passes that prune but fell outside the firings measured: those that
            # start in the first hour of the UTC day (workflows/reconcile.py).
            prune_passes = 0.0 if reconcile["every_pass_prunes"] else 3600.0 / reconcile["interval_seconds"]
            return {"certificates": count, "schedules": found, "bill": bill(found, prune_passes),
                    "worker_log_levels": dep.worker_log_levels()}
        finally:
            await dep.close()
    finally:
        await asyncio.to_thread(proxy.stop)


def table(result: dict[str, Any]) -> str:
    lines = []
    for label, found in result["runs"].items():
        lines.append(f"{label}:")
        for s in found["schedules"]:
            split = "; ".join(f"{k} {v:g}" for k, v in s["per_firing_split"].items())
            lines.append(
                f"  {s['schedule']:<20} every {s['interval_seconds']:>5g} s: {s['per_firing_total']:g} actions"
                f" per firing ({split}) x {s['firings_per_hour']:g}/h = {s['per_hour']:g}/h"
            )
            lines.append(f"  {'':<20} counter per firing: {s['per_firing_counter']}")
            lines.append(f"  {'':<20} Temporal Cloud's price: {s['cloud_per_firing']:g} per firing,"
                         f" {s['cloud_per_hour']:g}/h")
        b = found["bill"]
        extra = (f" (+ {b['prune_passes_per_day_added']:g} prune passes a day, one activity each)"
                 if b["prune_passes_per_day_added"] else "")
        lines.append(f"  schedules in all: {b['per_hour']:g} actions/h on the server's counter,"
                     f" {b['cloud_per_hour']:g} at Temporal Cloud's price{extra}")
        for n, v in b["per_cert_year"].items():
            lines.append(f"  per certificate-year at {int(n):,}: schedules {v['schedules']:g},"
                         f" with the renewal cycle ({b['cycle_per_cert_year']:g}) {v['with_the_cycle']:g};"
                         f" at Cloud's price {v['cloud_schedules']:g}, {v['cloud_with_the_cycle']:g}")
    return "\n".join(lines)
