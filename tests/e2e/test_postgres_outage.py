"""Our own database away in the middle of an attempt: the attempt fails, and is not
charged to the certificate's failure budget; the certificate is issued once
Postgres is back, from the one order it had.

A deployment of its own (tests/e2e/fault_fixtures.py) on an embedded Postgres of
its own that the test stops and starts again on the same data directory. The
fault proxy stops Postgres the moment Pebble has answered the hostname's finalize
(before the answer is relayed): the worker's finalize_and_store then meets
Postgres away when it stores the certificate, on every try, and the attempt fails
to the workflow. Postgres comes back once the history shows that failure.

Shown red: with the worker's StoreOutageInterceptor not typing the outage
(``store_unavailable`` answering False, as before: a bare FileNotFoundError, the
Unix socket gone, reached the workflow), the failure was charged: the row said
ACME_TEMPORARY with retry count 1.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from certflow.product.client import CertflowClient
from certflow.contract import workflow_id_for
from certflow.crypto import EncryptionKey, load_private_key, public_key_matches
from devstack import servers
from tests.e2e.fault_fixtures import (
    FinalizeTrap,
    Stack,
    build_stack,
    connect_client,
    describe,
    wait_for,
)

pytestmark = pytest.mark.e2e


@dataclass
class OutageStack:
    stack: Stack
    postgres: servers.PostgresServer
    postgres_dir: Path

    def restart_postgres(self) -> None:
        self.postgres = servers.start_embedded_postgres(self.postgres_dir)


@pytest.fixture(scope="module")
def outage_stack(
    temporal: servers.TemporalDevServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OutageStack]:
    workdir = tmp_path_factory.mktemp("postgres-outage")
    postgres = servers.start_embedded_postgres(workdir / "postgres")
    try:
        database_url = servers.create_database(postgres.url, "certflow_outage")
        stack = build_stack(workdir, temporal, database_url)
    except BaseException:
        postgres.stop()
        raise
    outage = OutageStack(stack, postgres, workdir / "postgres")
    try:
        yield outage
    finally:
        stack.stop()
        outage.postgres.stop()


@pytest.fixture(scope="module")
async def outage_client(outage_stack: OutageStack) -> AsyncIterator[CertflowClient]:
    client = await connect_client(outage_stack.stack)
    try:
        yield client
    finally:
        await client.close()


async def _finalize_failed(client: CertflowClient, hostname: str, timeout: float) -> None:
    """Wait until the workflow's history shows finalize_and_store failed (every try)."""
    handle = client.temporal.get_workflow_handle(workflow_id_for(hostname))
    deadline = time.monotonic() + timeout
    while True:
        history = await handle.fetch_history()
        names: dict[int, str] = {}
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                names[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                failed = event.activity_task_failed_event_attributes
                if names.get(failed.scheduled_event_id) == "finalize_and_store":
                    return
        assert time.monotonic() < deadline, "finalize_and_store never failed with Postgres away"
        await asyncio.sleep(0.2)


async def test_a_postgres_outage_mid_attempt_is_not_charged(
    outage_stack: OutageStack, outage_client: CertflowClient
) -> None:
    stack = outage_stack.stack
    assert stack.proxy is not None
    hostname = stack.hostname("outage")
    # Fast shutdown: every connection is cut.
    outage = FinalizeTrap(stack.proxy, hostname, lambda: outage_stack.postgres.stop())
    removers = outage.install()
    try:
        await outage_client.request([hostname])
        assert await asyncio.to_thread(outage.fired.wait, 60), (
            f"Pebble never answered a finalize; answers {outage.finalize_answers}"
        )
        await _finalize_failed(outage_client, hostname, timeout=60)
        await asyncio.to_thread(outage_stack.restart_postgres)
        recorded = await wait_for(
            outage_client,
            hostname,
            lambda r: r.error_code == "ACME_TEMPORARY" or r.status == "ACTIVE",
            timeout=60,
            what="the failed attempt recorded",
        )
        active = await wait_for(outage_client, hostname, lambda r: r.status == "ACTIVE", timeout=60)
    finally:
        for remove in removers:
            remove()
    print(
        f"\n[postgres outage at finalize] recorded: {describe(recorded)}; then {describe(active)};"
        f" orders {outage.orders_created}, finalize answers {outage.finalize_answers}"
    )
    assert recorded.status != "ACTIVE", "the failed attempt was never seen recorded"
    assert recorded.retry_count == 0, f"the outage was charged: {describe(recorded)}"
    assert (recorded.error_message or "").startswith("Postgres did not answer: "), recorded
    # Issued from the one order it had, with the key stored before finalize.
    assert outage.orders_created == 1 and outage.finalize_answers == [200]
    row = await outage_client.pool.fetchrow(
        "SELECT ssl_certificate, encrypted_ssl_private_key FROM certificates WHERE hostname = $1",
        hostname,
    )
    assert row is not None
    key = EncryptionKey(base64.b64decode(stack.env["CERTFLOW_ENCRYPTION_KEY"]))
    stored = load_private_key(key.decrypt(bytes(row["encrypted_ssl_private_key"])))
    assert public_key_matches(row["ssl_certificate"], stored)
