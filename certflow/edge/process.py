"""``certflow edge``: one process beside an edge, keeping it holding exactly the
current certificates until SIGTERM or SIGINT (certflow/edge/maintain.py).

Postgres unreachable, at start or later, is one line naming it and the setting,
then retries with backoff; the edge keeps what it holds meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import asyncpg
from temporalio.common import MetricMeter

from certflow.connect.connections import DATABASE_SETTING, open_postgres, redact_url
from certflow.crypto import EncryptionKey
from certflow.edge.files import FileTarget
from certflow.edge.maintain import BACKOFF, EdgeFollower, EdgeTarget
from certflow.edge.monitor import EdgeMonitor
from certflow.errors import ServiceUnreachableError
from certflow.metrics import prometheus_runtime
from certflow.edge.settings import EdgeSettings

log = logging.getLogger("certflow.edge")


def edge_target(settings: EdgeSettings) -> EdgeTarget:
    """The target of the configured kind (ConfigError when it cannot be used)."""
    if settings.edge_kind == "haproxy":
        from certflow.edge.haproxy import HAProxyTarget

        return HAProxyTarget(settings.edge_haproxy_socket, settings.edge_haproxy_crt_list)
    if settings.edge_kind == "caddy":
        from certflow.edge.caddy import CaddyTarget

        assert settings.edge_secret is not None  # the settings refuse the caddy kind without one
        return CaddyTarget(settings.edge_listen, settings.edge_secret.get_secret_value())
    return FileTarget(Path(settings.edge_dir), settings.edge_owner_ids)


def describe(settings: EdgeSettings) -> str:
    """What this process keeps current, for its first log line."""
    if settings.edge_kind == "haproxy":
        return f"HAProxy at {settings.edge_haproxy_socket} (crt-list {settings.edge_haproxy_crt_list})"
    if settings.edge_kind == "caddy":
        return f"Caddy's get_certificate endpoint on {settings.edge_listen}"
    return f"{settings.edge_dir} (files)"


async def _open_pool(url: str, stop: asyncio.Event) -> asyncpg.Pool | None:
    """A pool once Postgres answers (one line the first time it does not), or None
    when stopped first."""
    failures = 0
    while not stop.is_set():
        try:
            return await open_postgres(url, max_size=2)
        except ServiceUnreachableError as err:
            if failures == 0:
                log.warning("edge: %s; retrying", err)
            failures += 1
        try:
            await asyncio.wait_for(stop.wait(), BACKOFF[min(failures, len(BACKOFF)) - 1])
        except asyncio.TimeoutError:
            pass
    return None


async def run_edge(settings: EdgeSettings) -> int:
    """Run until SIGTERM or SIGINT; 0 then."""
    target = edge_target(settings)
    key = EncryptionKey(settings.encryption_key_bytes, settings.old_encryption_keys_bytes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    meter = MetricMeter.noop
    if settings.edge_metrics_listen:
        runtime = prometheus_runtime(settings.edge_metrics_listen, "CERTFLOW_EDGE_METRICS_LISTEN")
        meter = runtime.metric_meter
    await target.start()
    try:
        log.info("edge: keeping %s current", describe(settings))
        pool = await _open_pool(settings.database_url, stop)
        if pool is None:
            return 0
        try:
            source = f"Postgres at {redact_url(settings.database_url)} ({DATABASE_SETTING})"
            follower = EdgeFollower(pool, key, target, poll_seconds=settings.edge_poll_seconds, source=source)
            monitor = EdgeMonitor(
                follower, pool, name=settings.edge_display_name, kind=settings.edge_kind,
                tls_address=settings.edge_address, meter=meter,
            )
            reporting = asyncio.create_task(monitor.run(stop))
            try:
                await follower.run(stop)
            finally:
                stop.set()
                await reporting
        finally:
            await pool.close()
    finally:
        await target.stop()
    log.info("edge: stopped")
    return 0
