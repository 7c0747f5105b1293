"""One phase's certflow deployment: a fresh Temporal dev server, a fresh
database, a real worker process and a ``CertflowClient``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench import procstat
from bench.stack import Stack, start_temporal, temporal_pid, worker_pid
from devstack import servers
from certflow.connect.settings import ClientSettings
from certflow.product.client import CertflowClient

CNAME_TARGET = "edge.bench.test"


@dataclass
class Deployment:
    name: str
    temporal: servers.TemporalDevServer
    database: str
    database_url: str
    worker: servers.WorkerProcess
    client: CertflowClient
    watch: asyncpg.Connection
    """The bench's own connection to the measured database (tagged queries only)."""
    raw_key: bytes
    task_queue: str
    env: dict[str, str]
    pebble: servers.PebbleStack

    def new_hostnames(self, label: str, count: int) -> list[str]:
        """Unique hostnames whose CNAME points at the configured target."""
        tag = uuid.uuid4().hex[:6]
        names = [f"{label}-{i}.{tag}.bench.test" for i in range(count)]
        for name in names:
            self.pebble.set_cname(name, CNAME_TARGET)
        return names

    @property
    def worker_pid(self) -> int:
        pid = worker_pid(self.worker)
        assert pid is not None
        return pid

    @property
    def temporal_pid(self) -> int:
        pid = temporal_pid(self.temporal)
        assert pid is not None
        return pid

    def worker_peak_rss_mb(self) -> float | None:
        return procstat.peak_rss_mb(self.worker_pid)

    def worker_rss_mb(self) -> float | None:
        return procstat.rss_mb(self.worker_pid)

    def worker_log_levels(self) -> dict[str, int]:
        """Lines per level in the worker's JSON log (warnings and errors are worth a look)."""
        counts: dict[str, int] = {}
        for line in self.worker.log.read_text(errors="replace").splitlines():
            try:
                level = str(json.loads(line).get("level", "?"))
            except ValueError:
                level = "unparsed"
            counts[level] = counts.get(level, 0) + 1
        return counts

    async def close(self) -> None:
        await self.client.close()
        await self.watch.close()
        await asyncio.to_thread(self.worker.stop)
        await asyncio.to_thread(self.temporal.stop)


def _start_worker(code: Path, workdir: Path, env: dict[str, str]) -> servers.WorkerProcess:
    """``servers.start_worker`` from the code snapshot: ``python -m worker`` puts its
    working directory first on ``sys.path``, ahead of the live tree."""
    with contextlib.chdir(code):
        return servers.start_worker(workdir, env)


async def deploy(
    stack: Stack,
    workdir: Path,
    name: str,
    extra_env: dict[str, str],
    temporal_args: list[str] | None = None,
) -> Deployment:
    """Start Temporal (``temporal_args``: more ``start-dev`` flags), create the
    database and start a worker wired to them."""
    temporal = await asyncio.to_thread(start_temporal, workdir / "temporal", temporal_args)
    try:
        database, url = await asyncio.to_thread(stack.new_database, f"bench_{name}")
        raw_key = secrets.token_bytes(32)
        task_queue = f"bench-{name}-{uuid.uuid4().hex[:6]}"
        env = servers.certflow_environment(
            pebble=stack.pebble,
            temporal_address=temporal.address,
            database_url=url,
            encryption_key=base64.b64encode(raw_key).decode(),
            cname_target=CNAME_TARGET,
            task_queue=task_queue,
            extra=extra_env,
        )
        worker = await asyncio.to_thread(_start_worker, stack.code, workdir / "worker", env)
    except BaseException:
        temporal.stop()
        raise
    client = await CertflowClient.connect(
        ClientSettings(database_url=url, temporal_address=temporal.address, task_queue=task_queue)
    )
    watch = await asyncpg.connect(url)
    return Deployment(
        name, temporal, database, url, worker, client, watch, raw_key, task_queue, env, stack.pebble
    )
