"""Scale: the steady-state bill of N parked ACTIVE certificates (issue 15, item 6).

One deployment — a Temporal dev server with its ``/metrics``, a database, a worker
on product defaults — whose CA is Pebble behind the fault proxy serving ARI with
``Retry-After: 43200`` (two checks per certificate a day, as Let's Encrypt
suggests). In order:

1. cycle: SAMPLES certificates issued through Pebble, handed an ARI window by the
   renewal-info sweep (a signal) and renewed in it, then handed the far window;
   their histories give one real cycle: the post-issuance run up to the renewal
   (the steady part) and the renewal;
2. cold start: N ACTIVE rows inserted by SQL (the sample's leaf, chain and key —
   re-encrypted per row —, distinct hostnames and serials, no workflow, the window
   the proxy serves) and one reconcile pass that starts all their workflows;
   then wait until every row was seen by its workflow and the task queue is empty;
3. one reconcile pass at steady state (it must start nothing);
4. the edge helper at N (bench/edge_probe.py, in a process of its own);
5. the steady window: each row's next ARI check spread over 12 h as steady state
   has them, the sweep's schedule on at the product interval, W seconds (a
   multiple of the interval holds exactly W / interval sweeps);
6. every history of every run read back and counted by event type.
The schedules are paused outside the window; the reconcile pass is measured on
its own (3) and amortized over the product interval by bench/scale_model.py.
Before each measurement the 1-minute load average must be at most 1.5 (polled
every minute, up to 20 minutes); the load is recorded with each figure.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import math
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import ScheduleHandle

from bench import procstat
from bench import scale_model as scale_model
from bench.actions import E, RunTally, action_metric, counter_delta, read_all, split_at_activity, summed, tally, ts
from bench.deploy import Deployment, deploy
from bench.pgstats import BENCH_TAG, PgSnapshot, PgStats, delta
from bench.stack import Stack
from bench.temporal_util import breakdown, wait_quiet
from certflow.contract import (
    CERTIFICATE_WORKFLOW,
    RECONCILE_WORKFLOW,
    RENEWAL_INFO_SWEEP_WORKFLOW,
    reconcile_schedule_id,
    renewal_info_sweep_schedule_id,
    workflow_id_for,
)
from certflow.crypto import EncryptionKey
from devstack import servers
from devstack.faultproxy import Endpoint, FaultProxy, start_fault_proxy
from certflow.workflow_payloads import RenewalInfoSweepResult

Log = Callable[[str], None]
SAMPLES = 3
TENANT = "bench-scale"
ARI_RETRY_AFTER = int(86400 / scale_model.ARI_CHECKS_PER_DAY)
SETTLE_SECONDS = 15.0
FLUSH_SECONDS = 11.0  # pg_stat_database counters of idle backends
PARK_TIMEOUT = 5400.0
STALL_SECONDS = 30.0
LOAD_LIMIT, LOAD_POLL, LOAD_MAX_WAIT = 1.5, 60.0, 1200.0
EDGE_CONTEXTS = 1000
EDGE_REFRESHES = 20
RENEWAL_ACTIVITY = "begin_renewal"
MANUAL_SWEEP = ":manual-bench-"  # the bench's own sweeps (the schedule's ids end in a timestamp)


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _text(query: str) -> str:
    return " ".join(query.split())[:600]


@dataclass
class Mark:
    at: float
    pg: PgSnapshot
    cpu: procstat.CpuSample
    actions: Counter[str]
    load: list[float]


class Scale:
    """One scale phase's deployment and its instruments."""

    def __init__(self, stack: Stack, pg: PgStats, dep: Deployment, proxy: FaultProxy, metrics_port: int, log: Log) -> None:
        self.stack, self.pg, self.dep, self.proxy, self.log = stack, pg, dep, proxy, log
        self.metrics_port = metrics_port
        self.roots = {"worker": dep.worker_pid, "temporal": dep.temporal_pid}
        temporal = dep.client.temporal
        self.sweep: ScheduleHandle = temporal.get_schedule_handle(renewal_info_sweep_schedule_id(dep.task_queue))
        self.reconcile: ScheduleHandle = temporal.get_schedule_handle(reconcile_schedule_id(dep.task_queue))

    # -- instruments ----------------------------------------------------------------

    async def wait_load(self, what: str) -> dict[str, Any]:
        """Wait while another engineer's run keeps the 1-minute load above LOAD_LIMIT."""
        began = time.monotonic()
        while os.getloadavg()[0] > LOAD_LIMIT and time.monotonic() - began < LOAD_MAX_WAIT:
            self.log(f"  scale: {what}: 1-min load {os.getloadavg()[0]:.2f} > {LOAD_LIMIT}, waiting a minute")
            await asyncio.sleep(LOAD_POLL)
        return {"waited_seconds": round(time.monotonic() - began, 1), "load_before": _load()}

    async def mark(self) -> Mark:
        return Mark(
            time.time(),
            await self.pg.snapshot(self.dep.database),
            procstat.sample_cpu(self.roots),
            await asyncio.to_thread(action_metric, self.metrics_port),
            _load(),
        )

    async def settled(self) -> tuple[PgSnapshot, Counter[str]]:
        """Postgres and the action metric once both caught up (counters of idle
        backends flush within ~10 s; the server's metric lags its RPCs a moment)."""
        await asyncio.sleep(FLUSH_SECONDS)
        return await self.pg.snapshot(self.dep.database), await asyncio.to_thread(action_metric, self.metrics_port)

    def between(self, a: Mark, b: Mark, later: tuple[PgSnapshot, Counter[str]] | None = None) -> dict[str, Any]:
        """What happened from mark a to mark b (CPU and time), Postgres and the action
        metric up to ``later`` when given."""
        pg_after, actions_after = later or (b.pg, b.actions)
        change = delta(a.pg, pg_after)
        return {
            "seconds": round(b.at - a.at, 2),
            "cpu_seconds": {k: round(b.cpu.seconds[k] - a.cpu.seconds.get(k, 0.0), 3) for k in self.roots},
            "cpu_percent": procstat.cpu_percent(a.cpu, b.cpu),
            "pg_statements": change.statements,
            "pg_xact_commit": change.counters["xact_commit"],
            "pg_statements_by_text": {_text(q): c for q, c in sorted(change.by_statement.items(), key=lambda kv: -kv[1])},
            "temporal_action_metric": counter_delta(a.actions, actions_after),
            "load_start": a.load,
            "load_end": b.load,
        }

    async def rows(self, hostnames: list[str]) -> list[asyncpg.Record]:
        return list(await self.dep.watch.fetch(
            f"""SELECT {BENCH_TAG} hostname::text AS h, status, ssl_serial, ari_window_start,
                       ssl_not_before, ssl_expires_at
                FROM certificates WHERE hostname::text = ANY($1::text[])""",
            hostnames,
        ))

    async def wait_rows(self, hostnames: list[str], ok: Callable[[list[asyncpg.Record]], bool], timeout: float, what: str) -> float:
        began = time.monotonic()
        while True:
            found = await self.rows(hostnames)
            if len(found) == len(hostnames) and ok(found):
                return time.monotonic() - began
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"scale: {what} not reached in {timeout:.0f} s: {[dict(r) for r in found]}")
            await asyncio.sleep(0.5)

    async def sweep_now(self) -> RenewalInfoSweepResult:
        """One renewal-info sweep, as its schedule would start it."""
        result: RenewalInfoSweepResult = await self.dep.client.temporal.execute_workflow(
            RENEWAL_INFO_SWEEP_WORKFLOW,
            id=f"{renewal_info_sweep_schedule_id(self.dep.task_queue)}{MANUAL_SWEEP}{uuid.uuid4().hex[:8]}",
            task_queue=self.dep.task_queue,
            result_type=RenewalInfoSweepResult,
        )
        return result

    async def backlog(self) -> dict[str, int]:
        temporal = self.dep.client.temporal
        found = {}
        for name, kind in (("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
                           ("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)):
            answer = await temporal.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
                namespace=temporal.namespace, task_queue=TaskQueue(name=self.dep.task_queue),
                task_queue_type=kind, report_stats=True,
            ))
            found[name] = int(answer.stats.approximate_backlog_count)
        return found

    # -- 1. one real cycle -----------------------------------------------------------

    async def cycle(self) -> dict[str, Any]:
        proxy, log = self.proxy, self.log
        names = self.dep.new_hostnames("cycle", SAMPLES)
        ids = [workflow_id_for(h) for h in names]
        temporal = self.dep.client.temporal
        before = await self.mark()
        await self.dep.client.request(names, tenant_id="bench-cycle")
        issued = await self.wait_rows(names, lambda rs: all(r["status"] == "ACTIVE" for r in rs), 180, "issuance")
        await wait_quiet(temporal, ids, 60)
        first = {r["h"]: r["ssl_serial"] for r in await self.rows(names)}
        log(f"  scale: cycle: {SAMPLES} certificates issued through Pebble in {issued:.1f} s")
        now = datetime.datetime.now(datetime.timezone.utc)
        window_a = proxy.serve_renewal_info(
            now + datetime.timedelta(seconds=40), now + datetime.timedelta(seconds=100),
            retry_after=str(ARI_RETRY_AFTER),
        )
        # The first answer's Retry-After passed (the next check is due): the sweep asks.
        await self.dep.watch.execute(
            f"UPDATE certificates SET ari_next_check_at = now() {BENCH_TAG}"
            " WHERE hostname::text = ANY($1::text[])",
            names,
        )
        swept_a = await self.sweep_now()
        # The renewals' own first ARI answer (asked at finalize): a window two thirds
        # into the new certificates' life, as a CA gives a fresh certificate — so the
        # run after the renewal is a whole steady cycle (the window never moves).
        sample = (await self.rows(names))[0]
        life = sample["ssl_expires_at"] - sample["ssl_not_before"]
        now = datetime.datetime.now(datetime.timezone.utc)
        window_b = proxy.serve_renewal_info(
            now + life * 0.60, now + life * 0.66, retry_after=str(ARI_RETRY_AFTER)
        )
        renewed = await self.wait_rows(
            names, lambda rs: all(r["status"] == "ACTIVE" and r["ssl_serial"] != first[r["h"]] for r in rs),
            420, "ARI renewal",
        )
        await wait_quiet(temporal, ids, 60)
        log(f"  scale: cycle: renewed in the ARI window {renewed:.1f} s after the sweep told them")
        await self.wait_rows(names, lambda rs: all(r["ari_window_start"] == window_b[0] for r in rs), 60, "window B")
        swept_b = await self.sweep_now()  # due only once Retry-After passed: asks none
        await wait_quiet(temporal, ids, 60)
        after = await self.mark()
        return {
            "hostnames": names,
            "issue_seconds": round(issued, 1),
            "renewed_after_signal_seconds": round(renewed, 1),
            "certificate_lifetime_days": round(life.total_seconds() / 86400, 2),
            "window_a": [w.isoformat() for w in window_a],
            "window_b": [w.isoformat() for w in window_b],
            "window_b_values": window_b,
            "sweep_a": swept_a.model_dump(),
            "sweep_b": swept_b.model_dump(),
            "measured": self.between(before, after),
        }

    # -- 2. cold start ---------------------------------------------------------------

    async def insert_rows(self, n: int, template_host: str, window: tuple[datetime.datetime, datetime.datetime]) -> tuple[list[str], float]:
        watch = self.dep.watch
        tmpl = await watch.fetchrow(
            f"""SELECT {BENCH_TAG} ssl_certificate, ssl_certificate_chain, encrypted_ssl_private_key,
                       ssl_not_before, ssl_expires_at FROM certificates WHERE hostname = $1""",
            template_host,
        )
        assert tmpl is not None
        key = EncryptionKey(self.dep.raw_key)
        key_pem = key.decrypt(bytes(tmpl["encrypted_ssl_private_key"]))
        tag = uuid.uuid4().hex[:6]
        hostnames = [f"scale-{i}.{tag}.bench.test" for i in range(n)]
        rows = [
            (h, TENANT, "ACTIVE", tmpl["ssl_certificate"], tmpl["ssl_certificate_chain"], key.encrypt(key_pem),
             f"5ca1e{i:011x}", tmpl["ssl_not_before"], tmpl["ssl_expires_at"], window[0], window[1])
            for i, h in enumerate(hostnames)
        ]
        began = time.monotonic()
        await watch.executemany(
            f"""INSERT INTO certificates {BENCH_TAG} (hostname, tenant_id, status, ssl_certificate,
                    ssl_certificate_chain, encrypted_ssl_private_key, ssl_serial, ssl_not_before,
                    ssl_expires_at, ari_window_start, ari_window_end)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)""",
            rows,
        )
        return hostnames, time.monotonic() - began

    async def wait_parked(self, n: int, hostnames: list[str]) -> dict[str, Any]:
        """Until every row was seen by its workflow (its one ensure_certificate) and
        the task queue holds no task; then a sample must be quiet (on its timer)."""
        began = time.monotonic()
        samples: list[tuple[float, int, float | None]] = []
        last_log = 0.0
        backlog: dict[str, int] = {}
        extra_passes: list[dict[str, Any]] = []
        progress = (0, time.monotonic())
        while time.monotonic() - began < PARK_TIMEOUT:
            seen = int(await self.dep.watch.fetchval(
                f"SELECT {BENCH_TAG} count(*) FROM certificates WHERE tenant_id = $1 AND workflow_seen_at IS NOT NULL",
                TENANT,
            ))
            samples.append((round(time.monotonic() - began, 1), seen, self.dep.worker_rss_mb()))
            if seen > progress[0]:
                progress = (seen, time.monotonic())
            elif seen < n and time.monotonic() - progress[1] > STALL_SECONDS:
                # Rows left without a workflow (the pass failed): the schedule's next
                # pass would start them; run it now, back to back.
                t = time.monotonic()
                entry: dict[str, Any] = {"at": round(t - began, 1), "seen_before": seen}
                try:
                    outcome = await self.dep.client.reconcile_now()
                    entry["started"] = outcome.total_started
                except Exception as err:
                    entry["error"] = f"{err!r} / {err.__cause__!r}"[:400]
                entry["seconds"] = round(time.monotonic() - t, 1)
                extra_passes.append(entry)
                self.log(f"    parking stalled at {seen}/{n}: one more reconcile pass: {entry}")
                progress = (seen, time.monotonic())
            if time.monotonic() - last_log > 30:
                last_log = time.monotonic()
                self.log(f"    parking: {seen}/{n} seen, worker RSS {samples[-1][2]:.0f} MB")
            if seen >= n:
                backlog = await self.backlog()
                if not any(backlog.values()):
                    break
            await asyncio.sleep(3.0)
        seen_all = time.monotonic() - began
        sample = [workflow_id_for(h) for h in hostnames[:: max(1, n // 200)]]
        not_quiet = await wait_quiet(self.dep.client.temporal, sample, 300)
        return {
            "seconds": round(time.monotonic() - began, 1),
            "all_seen_seconds": round(seen_all, 1),
            "backlog_at_end": backlog,
            "extra_reconcile_passes": extra_passes,
            "quiet_sample": len(sample),
            "quiet_sample_not_quiet": len(not_quiet),
            "rss_samples": samples[:: max(1, len(samples) // 40)] + samples[-1:],
        }

    async def reconcile_pass(self, what: str) -> dict[str, Any]:
        """One reconcile pass (what its schedule runs), run now and measured:
        CPU right when it returns, Postgres after the stats flush."""
        load = await self.wait_load(what)
        before = await self.mark()
        found: dict[str, Any] = {}
        try:
            outcome = await self.dep.client.reconcile_now()
            found = {"checked": outcome.checked, "started": outcome.total_started, "refused": outcome.total_refused}
        except Exception as err:  # e.g. its activity timed out: recorded, the bench goes on
            found = {"error": repr(err)[:600], "cause": repr(err.__cause__)[:600]}
            self.log(f"  scale: {what} failed: {found}")
        after = await self.mark()
        measured = self.between(before, after, await self.settled())
        return {**load, "_mark": before, "started_at": before.at, "ended_at": after.at, **found, **measured}

    # -- 4. the edge helper ----------------------------------------------------------

    async def edge(self, hostnames: list[str]) -> dict[str, Any]:
        load = await self.wait_load("edge helper")
        request = {
            "database_url": self.dep.database_url,
            "key": base64.b64encode(self.dep.raw_key).decode(),
            "hostnames": hostnames[:: max(1, len(hostnames) // EDGE_CONTEXTS)][:EDGE_CONTEXTS],
            "refreshes": EDGE_REFRESHES,
        }
        pg_before = await self.pg.snapshot(self.dep.database)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-P", str(Path(__file__).with_name("edge_probe.py")),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(self.stack.code)},
        )
        out, err = await process.communicate(json.dumps(request).encode())
        if process.returncode != 0:
            raise RuntimeError(f"edge probe failed: {err.decode()[-2000:]}")
        change = delta(pg_before, await self.pg.snapshot(self.dep.database))
        found: dict[str, Any] = json.loads(out)
        return {**load, "load_after": _load(), **found,
                "pg_statements_by_text": {_text(q): c for q, c in change.by_statement.items()}}

    # -- 5. the steady window --------------------------------------------------------

    async def window(self, seconds: float) -> dict[str, Any]:
        load = await self.wait_load("steady window")
        interval = scale_model.SWEEP_SECONDS
        slot = math.floor(time.time() / interval) * interval
        # Steady state: each row's next check is spread over the Retry-After, so every
        # sweep finds one interval's worth due (the window's first one included).
        await self.dep.watch.execute(
            f"""UPDATE certificates {BENCH_TAG} AS c
                SET ari_next_check_at = to_timestamp($1 + (r.k + 0.5) * $2)
                FROM (SELECT id, row_number() OVER (ORDER BY id) - 1 AS k
                      FROM certificates WHERE tenant_id = $3) AS r
                WHERE c.id = r.id""",
            float(slot), ARI_RETRY_AFTER / max(1, await self._count()), TENANT,
        )
        self.proxy.reset_counts()
        before = await self.mark()
        await self.sweep.unpause(note="bench: steady window")
        await asyncio.sleep(seconds)
        await self.sweep.pause(note="bench: steady window over")
        nominal_end = time.time()
        temporal = self.dep.client.temporal
        query = f'WorkflowType="{RENEWAL_INFO_SWEEP_WORKFLOW}" AND ExecutionStatus="Running"'
        waited = time.monotonic()
        while [e async for e in temporal.list_workflows(query)] and time.monotonic() - waited < 1200:
            await asyncio.sleep(1.0)
        after = await self.mark()
        gets = self.proxy.count(Endpoint.RENEWAL_INFO)
        measured = self.between(before, after, await self.settled())
        return {
            **load,
            "requested_seconds": seconds,
            "started_at": before.at,
            "nominal_end": nominal_end,
            "ended_at": after.at,
            "ari_requests_at_proxy": gets,
            "worker_rss_mb": self.dep.worker_rss_mb(),
            "temporal_rss_mb": procstat.rss_mb(self.dep.temporal_pid),
            **measured,
        }

    async def _count(self) -> int:
        return int(await self.dep.watch.fetchval(
            f"SELECT {BENCH_TAG} count(*) FROM certificates WHERE tenant_id = $1", TENANT
        ))


def _median_counter(counters: list[Counter[str]]) -> dict[str, float]:
    keys = sorted({k for c in counters for k in c})
    return {k: float(statistics.median([c.get(k, 0) for c in counters])) for k in keys} if counters else {}


def _mean_counter(counters: list[Counter[str]]) -> dict[str, float]:
    keys = sorted({k for c in counters for k in c})
    return {k: round(sum(c.get(k, 0) for c in counters) / len(counters), 3) for k in keys} if counters else {}


def _activity_seconds(run: RunTally) -> float | None:
    events = run.events or []
    start = next((ts(e) for e in events if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED), None)
    end = next((ts(e) for e in events if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED), None)
    return None if start is None or end is None else round(end - start, 2)


async def histories(scale: Scale, cycle: dict[str, Any], parked: set[str], passes: dict[str, dict[str, Any]],
                    window: dict[str, Any]) -> dict[str, Any]:
    """Every run in the namespace, counted: the sample cycle, the parked runs, the
    sweeps started in the window, the two reconcile passes, everything in the window."""
    client = scale.dep.client.temporal
    samples = {workflow_id_for(h) for h in cycle["hostnames"]}
    t0, t1 = window["started_at"], window["ended_at"]
    runs = await read_all(client, (t0, t1), lambda wid: wid in samples or not wid.startswith("certificate:"))

    by_sample: dict[str, list[RunTally]] = {}
    for run in runs:
        if run.workflow_id in samples:
            by_sample.setdefault(run.workflow_id, []).append(run)
    steady: list[Counter[str]] = []
    renewal: list[Counter[str]] = []
    post: list[Counter[str]] = []
    issuing: list[Counter[str]] = []
    for wf_runs in by_sample.values():
        wf_runs.sort(key=lambda r: r.started_at)
        if len(wf_runs) < 3:
            continue
        issuing.append(wf_runs[0].total)
        head, tail = split_at_activity(wf_runs[1].events or [], RENEWAL_ACTIVITY)
        steady.append(tally(head))
        renewal.append(tally(tail))
        post.append(wf_runs[2].total)

    parked_runs = [r for r in runs if r.workflow_id in parked]
    parked_totals = [r.total for r in parked_runs]
    event_spread = Counter(r.total["events"] for r in parked_runs)

    sweeps = [r for r in runs if r.workflow_type == RENEWAL_INFO_SWEEP_WORKFLOW and MANUAL_SWEEP not in r.workflow_id
              and t0 <= r.started_at < window["nominal_end"]]
    sweep_results = []
    for run in sweeps:
        result = await client.get_workflow_handle(
            run.workflow_id, run_id=run.run_id, result_type=RenewalInfoSweepResult
        ).result()
        sweep_results.append({"asked": result.asked, "moved": result.moved,
                              "activity_seconds": _activity_seconds(run)})

    def pass_run(p: dict[str, Any]) -> dict[str, float]:
        found = [r for r in runs if r.workflow_type == RECONCILE_WORKFLOW
                 and p["started_at"] - 1 <= r.started_at <= p["ended_at"]]
        if not found:
            return {}
        timing = breakdown(found[0].events or [])
        return {**found[0].total, **{k: round(v, 2) for k, v in timing.items() if k.startswith("act_")}}

    in_window = {
        wf_type: dict(summed(r.in_window for r in runs if r.workflow_type == wf_type))
        for wf_type in sorted({r.workflow_type for r in runs})
    }
    return {
        "runs_read": len(runs),
        "cycle": {
            "samples": len(steady),
            "issuing_run": _median_counter(issuing),
            # Run 2 up to begin_renewal: parked, then the CA's window moved (sweep signal).
            "window_moved_part": _median_counter(steady),
            "renewal_part": _median_counter(renewal),
            # Run 3: the run after a renewal, parked on the window asked at finalize —
            # a whole steady cycle (nothing more happens until the renewal time).
            "steady_part": _median_counter(post),
        },
        "parked": {
            "runs": len(parked_runs),
            "parked_on_timer": sum(1 for r in parked_runs if r.parked),
            "workflows": len({r.workflow_id for r in parked_runs}),
            "per_run_median": _median_counter(parked_totals),
            "events_per_run_spread": {str(k): v for k, v in sorted(event_spread.items())},
        },
        "sweeps_in_window": {
            "runs": len(sweeps),
            "per_run_mean": _mean_counter([r.total for r in sweeps]),
            "results": sweep_results,
        },
        "reconcile_pass_runs": {name: pass_run(p) for name, p in passes.items()},
        "in_window_by_type": in_window,
        "certificate_events_in_window": in_window.get(CERTIFICATE_WORKFLOW, {}).get("events", 0),
    }


async def run_scale(stack: Stack, pg: PgStats, n: int, seconds: float, workdir: Path, log: Log = print) -> dict[str, Any]:
    began = time.monotonic()
    proxy = await asyncio.to_thread(start_fault_proxy, stack.pebble, stack.workdir / "pebble")
    try:
        # The worker reads the directory once, at start: advertise renewalInfo first.
        now = datetime.datetime.now(datetime.timezone.utc)
        proxy.serve_renewal_info(now + datetime.timedelta(days=30), now + datetime.timedelta(days=32),
                                 retry_after=str(ARI_RETRY_AFTER))
        metrics_port = servers.free_port()
        dep = await deploy(stack, workdir, f"scale{n}", {"CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url},
                           ["--metrics-port", str(metrics_port)])
        try:
            scale = Scale(stack, pg, dep, proxy, metrics_port, log)
            postmaster = await stack.postmaster_pid()
            if postmaster:
                scale.roots["postgres"] = postmaster
            await scale.sweep.pause(note="bench: outside the steady window")
            await scale.reconcile.pause(note="bench: passes are run and measured one at a time")
            return await _phases(scale, n, seconds, log, began)
        finally:
            await dep.close()
    finally:
        await asyncio.to_thread(proxy.stop)


async def _phases(scale: Scale, n: int, seconds: float, log: Log, began: float) -> dict[str, Any]:
    dep = scale.dep
    log(f"  scale: one real cycle with {SAMPLES} certificates (issue, ARI window, renewal)")
    cycle = await scale.cycle()
    window_b = cycle.pop("window_b_values")

    rss_before = dep.worker_rss_mb()
    hostnames, insert_seconds = await scale.insert_rows(n, cycle["hostnames"][0], window_b)
    log(f"  scale: {n} ACTIVE rows inserted in {insert_seconds:.1f} s; cold reconcile pass")
    cold = await scale.reconcile_pass("cold reconcile pass")
    cold_start = cold.pop("_mark")
    log(f"  scale: cold pass started {cold.get('started')} workflows in {cold['seconds']} s")
    parking = await scale.wait_parked(n, hostnames)
    log(f"  scale: parked {parking['seconds']} s after the pass returned; backlog {parking['backlog_at_end']}")
    await asyncio.sleep(SETTLE_SECONDS)
    rss_parked = dep.worker_rss_mb()
    parking["from_pass_start_to_parked"] = scale.between(cold_start, await scale.mark())

    steady_pass = await scale.reconcile_pass("steady reconcile pass")
    del steady_pass["_mark"]
    log(f"  scale: steady pass: {steady_pass['seconds']} s, started {steady_pass.get('started')},"
        f" worker CPU {steady_pass['cpu_seconds']['worker']} s, {steady_pass['pg_statements']} statements")
    edge = await scale.edge(hostnames)
    log(f"  scale: edge: first load {edge['first_load_seconds']} s (+{edge['load_rss_growth_mb']} MB),"
        f" refresh without change median {edge['refresh_no_change_median_ms']} ms")
    log(f"  scale: steady window {seconds:g} s (sweep every {scale_model.SWEEP_SECONDS:g} s)")
    window = await scale.window(seconds)
    log(f"  scale: window: {window['ari_requests_at_proxy']} ARI requests, {window['pg_statements']} statements,"
        f" worker CPU {window['cpu_percent']['worker']} %")
    log("  scale: reading every history back")
    counted = await histories(scale, cycle, {workflow_id_for(h) for h in hostnames},
                              {"cold": cold, "steady": steady_pass}, window)
    measured: dict[str, Any] = {
        "certificates": n,
        "samples": SAMPLES,
        "ari_retry_after_seconds": ARI_RETRY_AFTER,
        "sweep_interval_seconds": scale_model.SWEEP_SECONDS,
        "reconcile_interval_seconds": scale_model.RECONCILE_SECONDS,
        "cycle": cycle,
        "rows_insert_seconds": round(insert_seconds, 2),
        "cold_reconcile_pass": cold,
        "parking": parking,
        "worker_rss_mb_before_rows": rss_before,
        "worker_rss_mb_parked": rss_parked,
        "worker_peak_rss_mb": dep.worker_peak_rss_mb(),
        "steady_reconcile_pass": steady_pass,
        "edge": edge,
        "window": window,
        "histories": counted,
        "worker_log_levels": dep.worker_log_levels(),
        "phase_seconds": round(time.monotonic() - began, 1),
    }
    measured["model"] = scale_model.model(measured)
    return measured
