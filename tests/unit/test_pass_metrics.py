"""Reconcile and the renewal-info sweep count how each pass ended, on the SDK's
real Prometheus exporter: the alert on a failing pass reads this counter.

Checked: with ``counted_pass`` counting ``ok`` in a ``finally``, the failing
reconcile showed as ``ok`` and the test failed; restored."""

from __future__ import annotations

import asyncio
import re
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import asyncpg
import pytest
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from activities.pass_metrics import PASS_COUNTER
from activities.reconcile import ReconcileActivities
from activities.renewal_info import RenewalInfoSweep


class _DownPool:
    """A pool whose Postgres has gone away."""

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionRefusedError("Postgres is down")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _passes(address: str) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    found: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith(PASS_COUNTER + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            found[(labels["pass"], labels["result"])] = float(line.rpartition(" ")[2])
    return found


async def test_each_pass_is_counted_by_result() -> None:
    address = f"127.0.0.1:{_free_port()}"
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    reconcile = ReconcileActivities(cast(asyncpg.Pool, _DownPool()), cast(Client, None), "q")
    with pytest.raises(ConnectionRefusedError):
        await env.run(reconcile.reconcile_certificates, None)
    with ThreadPoolExecutor(max_workers=1) as executor:
        # No CA with ARI: the sweep ends at once, successfully.
        sweep = RenewalInfoSweep(cast(asyncpg.Pool, _DownPool()), [], executor, cast(Client, None))
        await env.run(sweep.sweep_renewal_info)

    expected = {("reconcile", "error"): 1.0, ("renewal_info_sweep", "ok"): 1.0}
    deadline = time.monotonic() + 10
    while (seen := await asyncio.to_thread(_passes, address)) != expected:
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.05)
