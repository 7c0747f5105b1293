"""What validating over DNS costs beside HTTP-01: the same deployment issues K
hostnames over http-01 (CNAME to the edge) and K over delegated dns-01 (the
customer's ``_acme-challenge`` CNAME into our zone, its traffic still elsewhere),
one after another, and reads each method's activities, history events, billable
actions, heartbeats and time to ACTIVE.

Real DNS throughout: Knot serves the customers' zone and, as a primary and its
secondary, the zone certflow writes TXTs into (TSIG-signed RFC 2136 updates);
Unbound resolves for certflow and for Pebble, which validates through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.actions import HEARTBEAT, action_metric, counter_delta
from bench.certflow_run import ISSUE_ENV, Watcher, issue
from bench.deploy import CNAME_TARGET, Deployment, deploy
from bench.stack import Stack
from bench.stats import summary
from bench.temporal_util import fetch_runs, summarize, wait_quiet
from certflow.contract import workflow_id_for
from certflow.dns.dns01 import delegation_label
from certflow.models import RequestedMethod
from devstack import servers
from devstack.dns01zone import start_dns01_servers
from devstack.realdns import RealDns

ELSEWHERE = "127.0.0.9"
"""A customer's current provider: the dns-01 hostnames' traffic never reaches us."""


def _http01_hostname(dns: RealDns, tag: str, i: int) -> str:
    name = f"http-{i}.{tag}.bench.test"
    dns.set_cname(name, CNAME_TARGET)
    return name


def _dns01_hostname(dns: RealDns, zone: str, tag: str, i: int) -> str:
    name = f"dns-{i}.{tag}.bench.test"
    with dns.batch() as edit:
        edit.set_a(name, [ELSEWHERE])
        edit.set_cname(f"_acme-challenge.{name}", f"{delegation_label(name)}.{zone}")
    return name


async def _measure(
    dep: Deployment, watcher: Watcher, metrics_port: int, method: RequestedMethod, names: list[str]
) -> dict[str, Any]:
    """Issue ``names`` one at a time over ``method``; the block's per-issuance figures."""
    before = await asyncio.to_thread(action_metric, metrics_port)
    times: list[float] = []
    for name in names:
        batch = await issue(dep, watcher, [name], 90, 0.01, method=method)
        if name not in batch.active_at:
            raise RuntimeError(f"{name} over {method.value} not ACTIVE: {batch.errors}")
        times.extend(batch.times_to_active())
        await wait_quiet(dep.client.temporal, [workflow_id_for(name)], 30, pause=0.02)
    actions = counter_delta(before, await asyncio.to_thread(action_metric, metrics_port))
    heartbeats = sum(v for k, v in actions.items() if k.endswith("/" + HEARTBEAT))
    runs = await fetch_runs(dep.client.temporal, {workflow_id_for(n) for n in names})
    history = summarize(runs)
    issuing = history["issuing_run_median"]
    activities = {
        k.removeprefix("count:activity:"): v for k, v in issuing.items() if k.startswith("count:activity:")
    }
    stats = summary(times)
    return {
        "method": method.value,
        "certificates": len(names),
        "time_to_active_p50": round(stats["p50"] or 0.0, 3),
        "time_to_active_p95": round(stats["p95"] or 0.0, 3),
        "activity_attempts_per_cert": issuing.get("count:activity_attempts"),
        "activities": activities,
        "events_per_cert_to_active": history["events_per_cert_to_active"],
        "billable_per_cert_to_active": history["billable_actions_per_cert_to_active"],
        "heartbeats_per_cert": round(heartbeats / len(names), 2),
        "workflow_tasks_per_cert": issuing.get("count:workflow_tasks"),
        # Median seconds each activity ran, where the extra time goes.
        "activity_seconds": {
            k.removeprefix("act_run:"): v for k, v in issuing.items() if k.startswith("act_run:")
        },
    }


async def run_methods(
    stack: Stack, count: int, workdir: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """http-01 then dns-01, ``count`` sequential issuances each, after one warm-up of each:
    ``blocks`` (per method) and the worker's log lines per level."""
    with contextlib.ExitStack() as cleanup:
        started = start_dns01_servers(workdir, cleanup, CNAME_TARGET)
        zone, dns = started.zone, started.dns
        env = {**ISSUE_ENV, **started.environment()}
        metrics_port = servers.free_port()
        local = dataclasses.replace(stack, pebble=started.pebble)
        dep = await deploy(local, workdir, "methods", env, ["--metrics-port", str(metrics_port)])
        try:
            watcher = Watcher(dep)
            tag = uuid.uuid4().hex[:6]
            warm = [
                (RequestedMethod.HTTP_01, _http01_hostname(dns, tag, 0)),
                (RequestedMethod.DNS_01, _dns01_hostname(dns, zone.zone, tag, 0)),
            ]
            for method, name in warm:
                await issue(dep, watcher, [name], 90, 0.01, method=method)
                await wait_quiet(dep.client.temporal, [workflow_id_for(name)], 30)
            blocks = {}
            makers: list[tuple[RequestedMethod, Callable[[int], str]]] = [
                (RequestedMethod.HTTP_01, lambda i: _http01_hostname(dns, tag, i)),
                (RequestedMethod.DNS_01, lambda i: _dns01_hostname(dns, zone.zone, tag, i)),
            ]
            for method, make in makers:
                names = [make(i) for i in range(1, count + 1)]
                blocks[method.value] = await _measure(dep, watcher, metrics_port, method, names)
                b = blocks[method.value]
                log(
                    f"  {method.value}: {count} ACTIVE; p50 {b['time_to_active_p50']} s;"
                    f" {b['activity_attempts_per_cert']} activities, {b['events_per_cert_to_active']} events,"
                    f" {b['billable_per_cert_to_active']} billable, {b['heartbeats_per_cert']} heartbeats per issuance"
                )
            return {"blocks": blocks, "worker_log_levels": dep.worker_log_levels()}
        finally:
            await dep.close()


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def table(found: dict[str, Any]) -> str:
    """Markdown: one row per method, then dns-01's extra over http-01."""
    columns = [
        ("p50 to ACTIVE (s)", "time_to_active_p50"),
        ("p95 (s)", "time_to_active_p95"),
        ("activities", "activity_attempts_per_cert"),
        ("history events", "events_per_cert_to_active"),
        ("billable in history", "billable_per_cert_to_active"),
        ("heartbeats", "heartbeats_per_cert"),
        ("workflow tasks", "workflow_tasks_per_cert"),
    ]
    lines = [
        "| method (per issuance) | " + " | ".join(c for c, _ in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    rows = [found[m] for m in ("http-01", "dns-01") if m in found]
    for row in rows:
        lines.append(f"| {row['method']} | " + " | ".join(_fmt(row.get(k)) for _, k in columns) + " |")
    if len(rows) == 2:
        extra = []
        for _, key in columns:
            a, b = rows[0].get(key), rows[1].get(key)
            extra.append("-" if a is None or b is None else f"{b - a:+.3g}")
        lines.append("| dns-01 − http-01 | " + " | ".join(extra) + " |")
        only = sorted(set(rows[1]["activities"]) - set(rows[0]["activities"]))
        lines.append("")
        lines.append(f"Activities only dns-01 runs: {', '.join(only) or 'none'}.")
        slower = {
            name: seconds - rows[0]["activity_seconds"].get(name, 0.0)
            for name, seconds in rows[1]["activity_seconds"].items()
        }
        worst = sorted(slower.items(), key=lambda kv: -(kv[1] or 0.0))[:3]
        lines.append(
            "Where dns-01's time goes (median s per activity, beyond http-01's): "
            + ", ".join(f"{name} {seconds:+.3f}" for name, seconds in worst)
            + "."
        )
    return "\n".join(lines)
