"""certificate_events: every transition recorded with the transition itself."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from certflow.product.client import CertflowClient
from tests.e2e.conftest import Deployment

pytestmark = pytest.mark.e2e


async def _until(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


async def test_events_follow_the_certificate(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    hostname = deployment.bare_hostname("events")
    await client.request([hostname])

    async def dns_failed() -> bool:
        return any(e.error_code == "DNS_CNAME" for e in await client.events(hostname))

    await _until(dns_failed)
    deployment.pebble.set_cname(hostname, "edge.saas.test")

    async def active() -> bool:
        return any(e.to_status == "ACTIVE" for e in await client.events(hostname))

    await _until(active)
    events = await client.events(hostname)
    steps = [(e.from_status, e.to_status, e.error_code) for e in events]
    assert steps[0] == (None, "PENDING", None)
    assert ("PENDING", "PENDING", "DNS_CNAME") in steps
    assert ("PENDING", "PROVISIONING", None) in steps
    assert steps[-1] == ("PROVISIONING", "ACTIVE", None)
    serial = await db.fetchval("SELECT ssl_serial FROM certificates WHERE hostname = $1", hostname)
    assert (events[-1].message or "").startswith(f"issued certificate {serial}")
    assert [e.at for e in events] == sorted(e.at for e in events)

    result = subprocess.run(
        [sys.executable, "starter.py", "events", hostname],
        cwd=Path(__file__).resolve().parents[2],
        env={k: deployment.env[k] for k in ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "PROVISIONING → ACTIVE" in result.stdout and "DNS_CNAME" in result.stdout
