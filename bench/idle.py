"""Idle cost: many ACTIVE certificates parked in their renewal wait.

Rows are seeded without the CA (self-signed EC P-256 leaves valid 90 days from
now, keys encrypted with the worker's key); each workflow is started with
``CertflowClient.request`` and runs ``ensure_certificate`` and ``renewal_info``
before it sleeps. Once all are parked, the worker, Postgres and the Temporal
dev server are watched for a fixed window.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bench import procstat
from bench.deploy import Deployment, deploy
from bench.pgstats import BENCH_TAG, PgStats, delta
from bench.stack import Stack
from bench.temporal_util import fetch_runs, summarize, wait_quiet
from certflow.crypto import EncryptionKey
from certflow.contract import reconcile_schedule_id, workflow_id_for
from certflow.running.worker_settings import Settings

SETTLE_SECONDS = 15.0
STATS_FLUSH_SECONDS = 11.0
RECONCILE_INTERVAL = float(Settings.model_fields["reconcile_interval_seconds"].default)
PARK_TIMEOUT = 900.0
START_CONCURRENCY = 8
RENEWAL_INFO_SQL = "SELECT ssl_certificate FROM certificates WHERE id = $1::uuid"

Row = tuple[str, str, str, str, bytes, str, datetime.datetime, datetime.datetime]


def make_rows(hostnames: list[str], key: EncryptionKey) -> list[Row]:
    """One self-signed leaf per hostname, issued now for 90 days; key encrypted."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    end = now + datetime.timedelta(days=90)
    rows: list[Row] = []
    for hostname in hostnames:
        private = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
            .sign(private, hashes.SHA256())
        )
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        leaf = cert.public_bytes(serialization.Encoding.PEM).decode()
        rows.append(
            (hostname, "bench", "ACTIVE", leaf, key.encrypt(pem), format(cert.serial_number, "x"), now, end)
        )
    return rows


async def seed(dep: Deployment, rows: list[Row]) -> None:
    await dep.watch.executemany(
        f"""INSERT INTO certificates {BENCH_TAG} (hostname, tenant_id, status, ssl_certificate,
                encrypted_ssl_private_key, ssl_serial, ssl_not_before, ssl_expires_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
        rows,
    )


async def start_all(dep: Deployment, hostnames: list[str]) -> None:
    """``CertflowClient.request`` in a few concurrent chunks."""
    size = -(-len(hostnames) // START_CONCURRENCY)
    chunks = [hostnames[i : i + size] for i in range(0, len(hostnames), size)]
    await asyncio.gather(*(dep.client.request(chunk, tenant_id="bench") for chunk in chunks))


async def wait_parked(
    dep: Deployment, pg: PgStats, workflow_ids: list[str], timeout: float, log: Callable[[str], None]
) -> list[str]:
    """Gate on Postgres (every workflow asked ``renewal_info``) or a quiet worker,
    then confirm with Temporal that every workflow is blocked on its timer."""
    deadline = time.monotonic() + timeout
    roots = {"worker": dep.worker_pid}
    last_log = 0.0
    quiet_samples = 0
    while time.monotonic() < deadline:
        before = procstat.sample_cpu(roots)
        await asyncio.sleep(2.0)
        worker_cpu = procstat.cpu_percent(before, procstat.sample_cpu(roots))["worker"]
        quiet_samples = quiet_samples + 1 if worker_cpu < 5.0 else 0
        asked = None
        if pg.statements:
            snap = await pg.snapshot(dep.database)
            assert snap.calls is not None
            asked = sum(c for q, c in snap.calls.items() if RENEWAL_INFO_SQL in " ".join(q.split()))
        if time.monotonic() - last_log > 15:
            last_log = time.monotonic()
            log(f"    parking: renewal_info asked {asked}/{len(workflow_ids)}, worker CPU {worker_cpu:.0f} %")
        if (asked is not None and asked >= len(workflow_ids)) or quiet_samples >= 2:
            break
    remaining = max(10.0, deadline - time.monotonic())
    return await wait_quiet(dep.client.temporal, workflow_ids, remaining)


async def measure_reconcile(dep: Deployment, pg: PgStats, roots: dict[str, int]) -> dict[str, Any]:
    """One reconcile pass (what its schedule runs), run now and measured."""
    pg_before = await pg.snapshot(dep.database)
    cpu_before = procstat.sample_cpu(roots)
    started = time.monotonic()
    outcome = await dep.client.reconcile_now()
    seconds = time.monotonic() - started
    await asyncio.sleep(STATS_FLUSH_SECONDS)
    cpu_after = procstat.sample_cpu(roots)
    change = delta(pg_before, await pg.snapshot(dep.database))
    cpu_seconds = {k: round(cpu_after.seconds[k] - cpu_before.seconds.get(k, 0.0), 2) for k in roots}
    return {
        "seconds": round(seconds, 2),
        "checked": outcome.checked,
        "started": outcome.total_started,
        "pg_statements": change.statements,
        "pg_xact_commit": change.counters["xact_commit"],
        "pg_statements_by_text": {" ".join(q.split())[:140]: c for q, c in change.by_statement.items()},
        "cpu_seconds": cpu_seconds,
    }


async def run_idle(
    stack: Stack,
    pg: PgStats,
    count: int,
    seconds: float,
    workdir: Path,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    # Product defaults here, the reconcile schedule included.
    dep = await deploy(stack, workdir, f"idle{count}", {})
    try:
        started = time.monotonic()
        hostnames = [f"idle-{i}.{dep.task_queue}.bench.test" for i in range(count)]
        rows = await asyncio.to_thread(make_rows, hostnames, EncryptionKey(dep.raw_key))
        generated = time.monotonic()
        await seed(dep, rows)
        seeded = time.monotonic()
        log(f"  idle: {count} rows made in {generated - started:.1f} s, inserted in {seeded - generated:.1f} s")
        await start_all(dep, hostnames)
        requested = time.monotonic()
        log(f"  idle: {count} workflows started in {requested - seeded:.1f} s")
        ids = [workflow_id_for(h) for h in hostnames]
        not_parked = await wait_parked(dep, pg, ids, PARK_TIMEOUT, log)
        parked = time.monotonic()
        log(f"  idle: parked after {parked - seeded:.1f} s from the first start ({len(not_parked)} not parked)")
        await asyncio.sleep(SETTLE_SECONDS)

        postmaster = await stack.postmaster_pid()
        roots = {"worker": dep.worker_pid, "temporal": dep.temporal_pid}
        if postmaster:
            roots["postgres"] = postmaster
        # The steady state is measured with the reconcile schedule paused (a pass that
        # fell inside a short window would stand for five minutes of idling); one pass
        # is measured on its own below and amortized over its interval.
        schedule = dep.client.temporal.get_schedule_handle(reconcile_schedule_id(dep.task_queue))
        await schedule.pause(note="bench: idle window")
        try:
            pg_before = await pg.snapshot(dep.database)
            cpu_before = procstat.sample_cpu(roots)
            await asyncio.sleep(seconds)
            cpu_after = procstat.sample_cpu(roots)
            pg_after = await pg.snapshot(dep.database)
        finally:
            await schedule.unpause(note="bench: idle window over")
        window = delta(pg_before, pg_after)
        cpu = procstat.cpu_percent(cpu_before, cpu_after)
        minutes = window.seconds / 60.0
        reconcile = await measure_reconcile(dep, pg, roots)
        sample = {workflow_id_for(h) for h in hostnames[:: max(1, count // 50)]}
        history = summarize(await fetch_runs(dep.client.temporal, sample))
        reconcile_ran = any("FROM certificates WHERE status <>" in q for q in window.by_statement)
        amortized_cpu = cpu["worker"] + reconcile["cpu_seconds"]["worker"] * 100 / RECONCILE_INTERVAL
        result = {
            "certificates": count,
            "rows_made_seconds": round(generated - started, 2),
            "rows_inserted_seconds": round(seeded - generated, 2),
            "request_seconds": round(requested - seeded, 2),
            "starts_per_second": round(count / max(requested - seeded, 1e-9), 1),
            "parked_after_seconds": round(parked - seeded, 1),
            "parked_per_second": round(count / max(parked - seeded, 1e-9), 1),
            "not_parked": len(not_parked),
            "window_seconds": round(window.seconds, 1),
            "worker_cpu_percent": cpu["worker"],
            "worker_cpu_percent_with_reconcile_amortized": round(amortized_cpu, 2),
            "worker_rss_mb": procstat.rss_mb(dep.worker_pid),
            "worker_peak_rss_mb": procstat.peak_rss_mb(dep.worker_pid),
            "temporal_cpu_percent": cpu["temporal"],
            "others_cpu_percent": cpu["others"],
            "postgres_cpu_percent": cpu.get("postgres"),
            "pg_statements_per_minute": None
            if window.statements is None
            else round(window.statements / minutes, 2),
            "pg_xact_commit_per_minute": round(window.counters["xact_commit"] / minutes, 2),
            "pg_counters": window.counters,
            "pg_statements_in_window": {" ".join(q.split())[:140]: c for q, c in window.by_statement.items()},
            "reconcile_ran_in_window": reconcile_ran,
            "reconcile_interval_seconds": RECONCILE_INTERVAL,
            "reconcile_pass": reconcile,
            "pg_statements_per_minute_with_reconcile_amortized": None
            if window.statements is None
            else round(window.statements / minutes + reconcile["pg_statements"] * 60 / RECONCILE_INTERVAL, 2),
            "worker_log_levels": dep.worker_log_levels(),
            "history_sample": history,
        }
        log(
            f"  idle: over {result['window_seconds']} s: worker CPU {result['worker_cpu_percent']} %,"
            f" RSS {result['worker_rss_mb']} MB, PG statements/min {result['pg_statements_per_minute']},"
            f" xact/min {result['pg_xact_commit_per_minute']}, Temporal CPU {result['temporal_cpu_percent']} %"
        )
        return result
    finally:
        await dep.close()
