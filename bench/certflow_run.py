"""certflow on real servers: N hostnames requested at once, each timed from the
request to its row turning ACTIVE (the row's ``updated_at`` at that transition)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import procstat
from bench.actions import HEARTBEAT, action_metric, counter_delta
from bench.deploy import Deployment, deploy
from bench.pgstats import BENCH_TAG, PgStats, delta
from bench.stack import Stack
from devstack import servers
from bench.stats import summary
from bench.temporal_util import fetch_runs, summarize, wait_quiet
from certflow.contract import workflow_id_for
from certflow.models import RequestedMethod

# The reconcile schedule is not per-certificate work; it is on in the idle phase.
ISSUE_ENV = {"CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0"}
STATS_FLUSH_SECONDS = 11.0  # backends report pg_stat_database counters within ~10 s when idle


class Watcher:
    """The bench's own (tagged, counted) queries on the measured database."""

    def __init__(self, dep: Deployment) -> None:
        self._conn = dep.watch
        self.queries = 0

    async def progress(self, hostnames: list[str]) -> tuple[int, int]:
        """(ACTIVE rows, rows carrying an error code)."""
        self.queries += 1
        row = await self._conn.fetchrow(
            f"""SELECT {BENCH_TAG} count(*) FILTER (WHERE status = 'ACTIVE') AS active,
                       count(*) FILTER (WHERE provisioning_error IS NOT NULL) AS errored
                FROM certificates WHERE hostname::text = ANY($1::text[])""",
            hostnames,
        )
        assert row is not None
        return int(row["active"]), int(row["errored"])

    async def active_at(self, hostnames: list[str]) -> dict[str, float]:
        """Epoch seconds of each ACTIVE row's ``updated_at`` (set by the ACTIVE transition)."""
        self.queries += 1
        rows = await self._conn.fetch(
            f"""SELECT {BENCH_TAG} hostname::text AS h, extract(epoch FROM updated_at)::float8 AS t
                FROM certificates WHERE status = 'ACTIVE' AND hostname::text = ANY($1::text[])""",
            hostnames,
        )
        return {r["h"]: float(r["t"]) for r in rows}

    async def inserted_at(self, hostnames: list[str]) -> dict[str, float]:
        """When each row was inserted (its first ``certificate_events`` entry)."""
        self.queries += 1
        rows = await self._conn.fetch(
            f"""SELECT {BENCH_TAG} hostname::text AS h, extract(epoch FROM min(at))::float8 AS t
                FROM certificate_events WHERE hostname::text = ANY($1::text[]) GROUP BY hostname""",
            hostnames,
        )
        return {r["h"]: float(r["t"]) for r in rows}

    async def errors(self, hostnames: list[str]) -> list[dict[str, Any]]:
        self.queries += 1
        rows = await self._conn.fetch(
            f"""SELECT {BENCH_TAG} hostname::text AS hostname, status, provisioning_error AS code,
                       provisioning_error_message AS message
                FROM certificates WHERE provisioning_error IS NOT NULL
                  AND hostname::text = ANY($1::text[])""",
            hostnames,
        )
        return [dict(r) for r in rows]


@dataclass
class Batch:
    hostnames: list[str]
    requested: float  # epoch seconds just before CertflowClient.request
    request_returned: float
    all_seen: float | None  # when the bench's poll saw every row ACTIVE
    active_at: dict[str, float] = field(default_factory=dict)
    inserted_at: dict[str, float] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def times_to_active(self) -> list[float]:
        return [t - self.requested for t in self.active_at.values()]

    def times_from_insert(self) -> list[float]:
        return [t - self.inserted_at[h] for h, t in self.active_at.items() if h in self.inserted_at]

    @property
    def wall(self) -> float | None:
        return max(self.active_at.values()) - self.requested if self.active_at else None


async def issue(
    dep: Deployment,
    watcher: Watcher,
    hostnames: list[str],
    timeout: float,
    poll: float,
    method: RequestedMethod | None = None,
) -> Batch:
    """Request all hostnames in one ``CertflowClient.request`` call; wait until all are
    ACTIVE (or the timeout)."""
    requested = time.time()
    request = asyncio.create_task(dep.client.request(hostnames, method=method))
    deadline = time.monotonic() + timeout
    all_seen = None
    while time.monotonic() < deadline:
        active, _ = await watcher.progress(hostnames)
        if active == len(hostnames):
            all_seen = time.time()
            break
        if request.done() and request.exception() is not None:
            break
        await asyncio.sleep(poll)
    await request
    batch = Batch(hostnames, requested, time.time(), all_seen)
    batch.active_at = await watcher.active_at(hostnames)
    batch.inserted_at = await watcher.inserted_at(hostnames)
    batch.errors = await watcher.errors(hostnames)
    return batch


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _rounded(stats: dict[str, float | int | None]) -> dict[str, float | int | None]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()}


async def run_size(
    stack: Stack,
    pg: PgStats,
    n: int,
    workdir: Path,
    repeats: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One phase: fresh Temporal, database and worker; a warm-up certificate; then
    N hostnames at once (N=1: ``repeats`` single requests one after another)."""
    metrics_port = servers.free_port()
    dep = await deploy(stack, workdir, f"n{n}", ISSUE_ENV, ["--metrics-port", str(metrics_port)])
    try:
        watcher = Watcher(dep)
        postmaster = await stack.postmaster_pid()
        roots = {"worker": dep.worker_pid, "temporal": dep.temporal_pid}
        pebble_pid = stack.pebble_pid()
        if pebble_pid:
            roots["pebble"] = pebble_pid
        if postmaster:
            roots["postgres"] = postmaster
        poll = 0.01 if n == 1 else 0.05

        warm_names = dep.new_hostnames("warm", 1)
        warm = await issue(dep, watcher, warm_names, 60, poll)
        await wait_quiet(dep.client.temporal, [workflow_id_for(h) for h in warm_names], 30)
        await asyncio.sleep(STATS_FLUSH_SECONDS)
        log(f"  N={n}: warm-up certificate ACTIVE after {warm.times_to_active() or ['-']} s")

        pg_before = await pg.snapshot(dep.database)
        queries_before = watcher.queries
        cpu_before = procstat.sample_cpu(roots)
        actions_before = await asyncio.to_thread(action_metric, metrics_port)
        batches: list[Batch] = []
        if n == 1:
            for i in range(repeats):
                names = dep.new_hostnames(f"one{i}", 1)
                batches.append(await issue(dep, watcher, names, 60, poll))
                await wait_quiet(dep.client.temporal, [workflow_id_for(names[0])], 30, pause=0.02)
        else:
            names = dep.new_hostnames(f"n{n}", n)
            batches.append(await issue(dep, watcher, names, 60 + 1.0 * n, poll))
        cpu_active = procstat.sample_cpu(roots)
        measured = [h for b in batches for h in b.hostnames]
        leftover = await wait_quiet(
            dep.client.temporal, [workflow_id_for(h) for h in measured], 60 + 0.5 * n
        )
        await asyncio.sleep(STATS_FLUSH_SECONDS)
        pg_after = await pg.snapshot(dep.database)
        actions = counter_delta(actions_before, await asyncio.to_thread(action_metric, metrics_port))
        heartbeats = sum(v for k, v in actions.items() if k.endswith("/" + HEARTBEAT))
        full_delta = delta(pg_before, pg_after, watcher.queries - queries_before)

        runs = await fetch_runs(dep.client.temporal, {workflow_id_for(h) for h in measured})
        history = summarize(runs)

        times = [t for b in batches for t in b.times_to_active()]
        from_insert = [t for b in batches for t in b.times_from_insert()]
        active = sum(len(b.active_at) for b in batches)
        if n == 1:
            walls = [b.wall for b in batches if b.wall is not None]
            wall = summary(walls)["p50"]
            rate = 1.0 / wall if wall else None
        else:
            wall = batches[0].wall
            rate = active / wall if wall else None
        result: dict[str, Any] = {
            "n": n,
            "repeats": len(batches),
            "requested": len(measured),
            "active": active,
            "errors": [e for b in batches for e in b.errors][:10],
            "not_parked": len(leftover),
            "warmup_seconds": _r(warm.times_to_active()[0] if warm.active_at else None),
            "time_to_active_seconds": _rounded(summary(times)),
            "time_from_row_insert_seconds": _rounded(summary(from_insert)),
            "request_call_seconds": _r(
                summary([b.request_returned - b.requested for b in batches])["p50"]
            ),
            "wall_seconds": _r(wall),
            "certs_per_second": _r(rate, 3),
            "worker_peak_rss_mb": _r(dep.worker_peak_rss_mb(), 1),
            "worker_rss_mb_after": _r(dep.worker_rss_mb(), 1),
            "cpu_percent_during_issuance": procstat.cpu_percent(cpu_before, cpu_active),
            "cpu_seconds_per_cert": procstat.cpu_seconds_per(cpu_before, cpu_active, len(measured)),
            "pg_counting": "pg_stat_statements (top-level calls)" if full_delta.statements is not None
            else "pg_stat_database xact_commit (transactions; no pg_stat_statements)",
            "pg_per_cert_to_parked": full_delta.per(len(measured)),
            "worker_log_levels": dep.worker_log_levels(),
            "temporal": history,
            # Recorded by the server (billable), not in histories: to the run parked.
            "heartbeats_per_cert": _r(heartbeats / len(measured), 2),
        }
        t = result["time_to_active_seconds"]
        log(
            f"  N={n}: {active}/{len(measured)} ACTIVE; p50 {t['p50']} s p95 {t['p95']} s;"
            f" wall {result['wall_seconds']} s; {result['certs_per_second']} certs/s;"
            f" worker peak RSS {result['worker_peak_rss_mb']} MB"
        )
        return result
    finally:
        await dep.close()
