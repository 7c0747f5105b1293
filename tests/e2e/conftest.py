"""A running certflow deployment for end-to-end tests: a worker process wired to
the session's real Postgres, Temporal dev server, Pebble and challtestsrv."""

from __future__ import annotations

import base64
import http.server
import json
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from temporalio.service import RPCError

from certflow import certificates
from certflow.dev import devstack
from certflow.crypto import EncryptionKey
from certflow.db import create_pool, migrate
from certflow.models import OpenedOrder
from certflow.contract import reconcile_schedule_id
from certflow.settings import ClientSettings
from certflow.client import CertflowClient

CNAME_TARGET = "edge.saas.test"


@dataclass
class Deployment:
    pebble: devstack.PebbleStack
    temporal: devstack.TemporalDevServer
    database_url: str
    env: dict[str, str]
    worker: devstack.WorkerProcess
    encryption_key: EncryptionKey

    def hostname(self, label: str = "shop") -> str:
        """A unique hostname whose CNAME already points at the edge."""
        host = self.bare_hostname(label)
        self.pebble.set_cname(host, CNAME_TARGET)
        return host

    def bare_hostname(self, label: str = "shop") -> str:
        """A unique hostname with no DNS set up."""
        return f"{label}.c{uuid.uuid4().hex[:10]}.test"


WEBHOOK_SECRET = "e2e-webhook-secret"


class WebhookReceiver:
    """A product's webhook endpoint on loopback: records deliveries, can refuse some."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.refuse_first: set[str] = set()  # hostnames whose first delivery gets a 500
        self._refused: set[str] = set()
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hostname = json.loads(body).get("hostname", "")
                with receiver._lock:
                    refuse = hostname in receiver.refuse_first and hostname not in receiver._refused
                    if refuse:
                        receiver._refused.add(hostname)
                    else:
                        receiver.deliveries.append((dict(self.headers.items()), body))
                self.send_response(500 if refuse else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks/certflow"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def events_for(self, hostname: str) -> list[tuple[dict[str, str], dict[str, object]]]:
        with self._lock:
            found = [(h, json.loads(b)) for h, b in self.deliveries]
        return [(h, e) for h, e in found if e["hostname"] == hostname]

    def raw_for(self, hostname: str) -> list[tuple[dict[str, str], bytes]]:
        with self._lock:
            return [(h, b) for h, b in self.deliveries if json.loads(b)["hostname"] == hostname]

    def stop(self) -> None:
        self._server.shutdown()


@pytest.fixture(scope="session")
def webhooks() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def deployment(
    pebble: devstack.PebbleStack,
    temporal: devstack.TemporalDevServer,
    new_database: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
    webhooks: WebhookReceiver,
) -> Iterator[Deployment]:
    database_url = new_database()
    raw_key = secrets.token_bytes(32)
    env = devstack.certflow_environment(
        pebble=pebble,
        temporal_address=temporal.address,
        database_url=database_url,
        encryption_key=base64.b64encode(raw_key).decode(),
        cname_target=CNAME_TARGET,
        task_queue=f"certflow-e2e-{uuid.uuid4().hex[:6]}",
        extra={
            "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
            "CERTFLOW_DNS_RECHECK_MAX_SECONDS": "2",
            "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
            "CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS": "4",
            "CERTFLOW_METRICS_LISTEN": f"127.0.0.1:{devstack.free_port()}",
            "CERTFLOW_METRICS_REFRESH_SECONDS": "1",
            "CERTFLOW_WEBHOOK_URL": webhooks.url,
            "CERTFLOW_WEBHOOK_SECRET": WEBHOOK_SECRET,
        },
    )
    workdir: Path = tmp_path_factory.mktemp("e2e-worker")
    worker = devstack.start_worker(workdir, env)
    try:
        yield Deployment(pebble, temporal, database_url, env, worker, EncryptionKey(raw_key))
    finally:
        worker.stop()


@pytest.fixture(scope="session")
async def client(deployment: Deployment) -> AsyncIterator[CertflowClient]:
    c = await CertflowClient.connect(
        ClientSettings(
            database_url=deployment.database_url,
            temporal_address=deployment.temporal.address,
            task_queue=deployment.env["CERTFLOW_TASK_QUEUE"],
        )
    )
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="session")
async def db(deployment: Deployment) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(deployment.database_url, max_size=2)
    await migrate(pool)
    try:
        yield pool
    finally:
        await pool.close()


@asynccontextmanager
async def reconcile_schedule_paused(client: CertflowClient, note: str) -> AsyncIterator[None]:
    """Hold the deployment's reconcile schedule, which would start workflows for rows
    a test plants by SQL (nothing to hold when no schedule is installed)."""
    handle = client.temporal.get_schedule_handle(reconcile_schedule_id(client.task_queue))
    try:
        await handle.pause(note=note)
    except RPCError:
        yield
        return
    try:
        yield
    finally:
        await handle.unpause()


async def plant_challenge(db: asyncpg.Pool, hostname: str) -> tuple[str, OpenedOrder]:
    """A row for hostname with an open HTTP-01 challenge, as place_order leaves it, with
    no CA involved: (certificate id, the order). Remove it with certificates.delete."""
    token = secrets.token_urlsafe(32)
    record = await certificates.ensure_certificate(db, hostname, None, None)
    order = OpenedOrder(
        order_url=f"https://ca.invalid/order/{uuid.uuid4().hex}",
        challenge_url=f"https://ca.invalid/chall/{uuid.uuid4().hex}",
        token=token,
        key_authorization=f"{token}.{secrets.token_urlsafe(32)}",
    )
    assert await certificates.persist_challenge(db, record.certificate_id, order)
    return record.certificate_id, order
