"""A running certflow deployment for end-to-end tests: a worker process wired to
the session's real Postgres, Temporal dev server, Pebble and challtestsrv."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import secrets
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import ScheduleActionExecutionStartWorkflow, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from certflow.store import certificates
from devstack import servers
from certflow.crypto import EncryptionKey
from certflow.store.db import create_pool, migrate
from certflow.activity_payloads import OpenedOrder
from certflow.contract import reconcile_schedule_id
from certflow.connect.settings import ClientSettings
from certflow.product.client import CertflowClient
from certflow.hostnames import Hostname, as_hostname

CNAME_TARGET = "edge.saas.test"


@dataclass
class Deployment:
    pebble: servers.PebbleStack
    temporal: servers.TemporalDevServer
    database_url: str
    env: dict[str, str]
    worker: servers.WorkerProcess
    encryption_key: EncryptionKey
    key_capture: Path
    """Every private key the worker generated (servers.captured_keys reads it)."""

    def hostname(self, label: str = "shop") -> Hostname:
        """A unique hostname whose CNAME already points at the edge."""
        host = self.bare_hostname(label)
        self.pebble.set_cname(host, CNAME_TARGET)
        return host

    def bare_hostname(self, label: str = "shop") -> Hostname:
        """A unique hostname with no DNS set up."""
        return as_hostname(f"{label}.c{uuid.uuid4().hex[:10]}.test")


WEBHOOK_SECRET = "e2e-webhook-secret"


@dataclass(frozen=True)
class WebhookAttempt:
    """One POST the receiver got, whatever it answered."""

    at: float
    """time.monotonic() in this process when the request had been read"""
    hostname: str
    event: str
    event_id: str
    answered: int


class WebhookReceiver:
    """A product's webhook endpoint on loopback: records deliveries, can refuse some."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.attempts: list[WebhookAttempt] = []  # every POST, refused ones included
        self.refuse_first: set[str] = set()  # hostnames whose first delivery gets a 500
        self.gone: set[str] = set()  # hostnames whose every delivery gets a 410 Gone
        self._refused: set[str] = set()
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                at = time.monotonic()
                event = json.loads(body)
                hostname = str(event.get("hostname", ""))
                with receiver._lock:
                    refuse = hostname in receiver.refuse_first and hostname not in receiver._refused
                    if hostname in receiver.gone:
                        status = 410
                    elif refuse:
                        receiver._refused.add(hostname)
                        status = 500
                    else:
                        status = 204
                        receiver.deliveries.append((dict(self.headers.items()), body))
                    receiver.attempts.append(
                        WebhookAttempt(
                            at, hostname, str(event.get("event")), str(event.get("event_id")), status
                        )
                    )
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks/certflow"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def events_for(self, hostname: str) -> list[tuple[dict[str, str], dict[str, object]]]:
        """Deliveries answered 204, oldest first."""
        with self._lock:
            found = [(h, json.loads(b)) for h, b in self.deliveries]
        return [(h, e) for h, e in found if e["hostname"] == hostname]

    def attempts_for(self, hostname: str) -> list[WebhookAttempt]:
        """Every POST for hostname (refused and gone ones included), oldest first."""
        with self._lock:
            return [a for a in self.attempts if a.hostname == hostname]

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
    pebble: servers.PebbleStack,
    temporal: servers.TemporalDevServer,
    new_database: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
    webhooks: WebhookReceiver,
) -> Iterator[Deployment]:
    database_url = new_database()
    raw_key = secrets.token_bytes(32)
    env = servers.certflow_environment(
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
            "CERTFLOW_METRICS_LISTEN": f"127.0.0.1:{servers.free_port()}",
            "CERTFLOW_METRICS_REFRESH_SECONDS": "1",
            "CERTFLOW_WEBHOOK_URL": webhooks.url,
            "CERTFLOW_WEBHOOK_SECRET": WEBHOOK_SECRET,
        },
    )
    workdir: Path = tmp_path_factory.mktemp("e2e-worker")
    key_capture = workdir / "generated-keys.hex"
    worker = servers.start_worker(workdir, env, capture_keys=key_capture)
    try:
        yield Deployment(pebble, temporal, database_url, env, worker, EncryptionKey(raw_key), key_capture)
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


_schedule_holds: dict[str, int] = {}


@asynccontextmanager
async def reconcile_schedule_paused(client: CertflowClient, note: str) -> AsyncIterator[None]:
    """Hold the deployment's reconcile schedule, which would start workflows for rows
    a test plants by SQL (nothing to hold when no schedule is installed).

    Holds nest (a module-wide hold and a test's own): the schedule is unpaused when
    the outermost one ends. Delete the planted rows before that."""
    schedule_id = reconcile_schedule_id(client.task_queue)
    if _schedule_holds.get(schedule_id, 0) > 0:
        _schedule_holds[schedule_id] += 1
        try:
            yield
        finally:
            _schedule_holds[schedule_id] -= 1
        return
    handle = client.temporal.get_schedule_handle(schedule_id)
    try:
        await handle.pause(note=note)
    except RPCError as err:
        # No schedule (a deployment with reconcile off) is nothing to hold; any other
        # error is a hold that did not take, and the test must not go on unheld.
        if err.status is not RPCStatusCode.NOT_FOUND:
            raise
        yield
        return
    _schedule_holds[schedule_id] = 1
    try:
        # A reconcile pass the schedule started just before the pause could still
        # read rows planted from now on: let it finish first.
        for action in (await handle.describe()).info.running_actions:
            if isinstance(action, ScheduleActionExecutionStartWorkflow):
                running = client.temporal.get_workflow_handle(
                    action.workflow_id, run_id=action.first_execution_run_id
                )
                with contextlib.suppress(WorkflowFailureError, RPCError):
                    await asyncio.wait_for(running.result(), 60)
        yield
    finally:
        _schedule_holds[schedule_id] = 0
        await handle.unpause()


async def plant_challenge(db: asyncpg.Pool, hostname: Hostname) -> tuple[str, OpenedOrder]:
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


LOG_SENTINEL_REQUEST = b"certflow-log-sentinel\r\n\r\n"
LOG_SENTINEL_WARNING = "Invalid HTTP request received."  # uvicorn's, logged before its 400


def _send_log_sentinel(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(LOG_SENTINEL_REQUEST)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


async def worker_log_after_sentinel(
    worker: servers.WorkerProcess, offset: int, timeout: float = 30.0
) -> bytes:
    """The worker's log from byte ``offset`` on, read once it holds the line of a
    sentinel sent now: a malformed request the worker's responder answers 400 after
    logging uvicorn's warning. The responder handles requests on one event loop, so
    when the sentinel's line is there, every request answered before it was sent has
    been handled and its lines written; waiting on that line replaces a sleep."""
    sent_at = datetime.now(timezone.utc)
    answer = await asyncio.to_thread(_send_log_sentinel, worker.http01_host, worker.http01_port)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    deadline = time.monotonic() + timeout
    while True:
        log = worker.log.read_bytes()[offset:]
        for raw in log.splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if (
                isinstance(entry, dict)
                and entry.get("message") == LOG_SENTINEL_WARNING
                and datetime.fromisoformat(str(entry.get("time"))) >= sent_at
            ):
                return log
        assert time.monotonic() < deadline, f"the sentinel's log line never came after {timeout}s"
        await asyncio.sleep(0.05)
