"""Record the Certificate workflow histories that test_replay.py replays.

    .venv/bin/python -m tests.workflows.record_histories [LABEL]

Runs the scenarios on real servers (Temporal dev server, embedded Postgres,
Pebble, challtestsrv, a fault proxy in front of Pebble serving ARI, a worker)
and writes every run's history to
tests/workflows/histories/<scenario>[-LABEL]-<n>.json. Never overwrite: the
point of the checked-in files is that every later change to the workflow still
replays them (patch with workflow.patched() where it would not). After a patch
that changes these scenarios' paths, record them again under a label naming it.

The ``one-step`` label holds the six scenarios on the order-in-one-step design
(ORDER_IN_ONE_STEP_DESIGN), the ``kept-run`` label on the design that keeps its
run after an issuance (RUN_KEPT_AFTER_ISSUANCE_DESIGN, the design the client asks
for); the labels before them (none, ``place-order``, ``sweep``, ``carried``,
``fewer``, ``rows``) are of the retired designs 1 and 2, in histories/retired.
Record the next design under a label of its own. ``failure-and-retry`` needs a
CA that fails a validation the self-check passes, which one DNS for both cannot
give: it was recorded only without a label; the FAILED path's history is
recorded with the fakes (record_patch_histories.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from devstack import servers
from devstack.faultproxy import Endpoint, Fault, FaultProxy, start_fault_proxy
from certflow.settings import ClientSettings
from certflow.client import CertflowClient
from certflow.workflow_payloads import CertificateState

HISTORIES = Path(__file__).parent / "histories"
LABEL = ""
TARGET = "edge.replay.test"
MANAGED = "managed.replay.test"


async def _until(
    client: CertflowClient,
    hostname: str,
    predicate: Callable[[CertificateState], bool],
    timeout: float = 90,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        report = await client.status(hostname)
        if report is not None and predicate(report):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{hostname}: {report}")
        await asyncio.sleep(0.2)


def _settled(report: CertificateState) -> bool:
    return report.status == "ACTIVE" and "renewal time" in (report.phase or "")


async def _export(client: CertflowClient, hostname: str, scenario: str) -> None:
    if LABEL:
        scenario = f"{scenario}-{LABEL}"
    runs = [
        w.run_id
        async for w in client.temporal.list_workflows(f'WorkflowId="certificate:{hostname}"')
    ]
    for n, run_id in enumerate(reversed(runs), 1):  # oldest first
        handle = client.temporal.get_workflow_handle(f"certificate:{hostname}", run_id=run_id)
        history = await handle.fetch_history()
        path = HISTORIES / f"{scenario}-{n}.json"
        if path.exists():
            raise FileExistsError(f"{path} is checked in: record under a new label")
        path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
        print(f"wrote {path.name} ({len(history.events)} events)")


async def _scenarios(
    client: CertflowClient, pebble: servers.PebbleStack, proxy: FaultProxy
) -> None:
    scenarios: dict[str, Callable[[str], Awaitable[None]]] = {}

    async def happy_path(host: str) -> None:
        pebble.set_cname(host, TARGET)
        await client.request([host], tenant_id="tenant-replay")
        await _until(client, host, _settled)

    async def dns_wait(host: str) -> None:
        await client.request([host])
        await _until(client, host, lambda r: r.error_code == "DNS_CNAME")
        pebble.set_cname(host, TARGET)
        await _until(client, host, _settled)

    async def failure_and_retry(host: str) -> None:
        pebble.add_a(host, ["127.0.0.9"])  # nothing listens: validation fails
        await client.request([host])
        await _until(client, host, lambda r: r.status == "FAILED")
        pebble.clear_a(host)
        await client.retry(host)
        await _until(client, host, _settled)

    async def renewal(host: str) -> None:
        pebble.set_cname(host, TARGET)
        await client.request([host])
        await _until(client, host, _settled)
        await client.renew(host)
        await _until(client, host, lambda r: _settled(r) and r.serial is not None)
        await asyncio.sleep(1)

    async def edge_unreachable(host: str) -> None:
        pebble.add_a(host, ["127.0.0.9"])  # nothing listens: the self-check fails
        await client.request([host])
        await _until(client, host, lambda r: r.error_code == "HTTP01_UNREACHABLE")
        pebble.clear_a(host)
        await client.retry(host)
        await _until(client, host, _settled)

    async def rate_limited(host: str) -> None:
        pebble.set_cname(host, TARGET)
        proxy.inject(Endpoint.NEW_ORDER, Fault.rate_limited("1"))
        await client.request([host])
        await _until(client, host, _settled)

    async def ari_renewal(host: str) -> None:
        pebble.set_cname(host, TARGET)
        await client.request([host])
        await _until(client, host, _settled)
        first = await client.status(host)
        assert first is not None
        now = datetime.now(timezone.utc)
        # The CA's window opens now: the sweep tells the workflow, which renews.
        proxy.serve_renewal_info(
            now - timedelta(minutes=1), now + timedelta(seconds=30), retry_after="1"
        )
        def replaced(report: CertificateState) -> bool:
            # The replacement, given a window open again, waits for the sweep's next
            # answer rather than for its renewal time.
            renewal = "renewal" in (report.phase or "")
            return report.status == "ACTIVE" and report.serial != first.serial and renewal

        await _until(client, host, replaced, timeout=120)
        later = datetime.now(timezone.utc) + timedelta(days=60)
        proxy.serve_renewal_info(later, later + timedelta(days=2), retry_after="1")
        await asyncio.sleep(1)

    scenarios = {
        "happy-path": happy_path,
        "dns-wait": dns_wait,
        "renewal": renewal,
        "edge-unreachable": edge_unreachable,
        "rate-limited": rate_limited,
        "ari-renewal": ari_renewal,
    }
    if not LABEL:  # the first recording only: see the module docstring
        scenarios["failure-and-retry"] = failure_and_retry
    for name, scenario in scenarios.items():
        managed = name in ("failure-and-retry", "edge-unreachable")  # no CNAME: its own A record
        host = f"{name}.{MANAGED}" if managed else f"{name}.replay.test"
        await scenario(host)
        await client.cancel(host)
        await _export(client, host, name)


async def _main(workdir: Path) -> None:
    postgres = servers.start_embedded_postgres(workdir / "postgres")
    temporal = servers.start_temporal(workdir / "temporal")
    pebble = servers.start_pebble(workdir / "pebble", nonce_reject_percent=0)
    proxy = start_fault_proxy(pebble, workdir / "pebble")
    # The CA's ARI, from the start (the worker reads the directory once): a window
    # well ahead, until ari_renewal opens one now.
    later = datetime.now(timezone.utc) + timedelta(days=60)
    proxy.serve_renewal_info(later, later + timedelta(days=2), retry_after="1")
    worker = None
    try:
        database_url = servers.create_database(postgres.url, "certflow_replay")
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=database_url,
            encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
            cname_target=TARGET,
            extra={
                "CERTFLOW_MANAGED_BASE_DOMAIN": MANAGED,
                "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
                "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
                "CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS": "2",
                "CERTFLOW_FAILED_RETRY_SECONDS": "0",
                "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
                "CERTFLOW_RENEWAL_INFO_SWEEP_SECONDS": "1",
                "CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url,
            },
        )
        worker = servers.start_worker(workdir / "worker", env)
        client = await CertflowClient.connect(
            ClientSettings(database_url=database_url, temporal_address=temporal.address)
        )
        try:
            await _scenarios(client, pebble, proxy)
        finally:
            await client.close()
    finally:
        for server in (worker, proxy, pebble, temporal, postgres):
            if server is not None:
                server.stop()


if __name__ == "__main__":
    LABEL = sys.argv[1] if len(sys.argv) > 1 else ""
    HISTORIES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="certflow-histories-") as tmp:
        asyncio.run(_main(Path(tmp)))
