"""Encrypted payloads on real servers: a worker and the CLI with CERTFLOW_PAYLOAD_KEY
issue a certificate, every history on their task queue read raw through the
Temporal service API holds no hostname, tenant id or account URL, and the codec
server shows them again to the holder of its secret only (the Temporal CLI's
``--codec-endpoint``).

Red once with the codec off (the worker and CLI started without
CERTFLOW_PAYLOAD_KEY): the raw scan found the hostname in the workflow's start
input, its activities' inputs and results and the updates' answers."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest
from temporalio.client import Client

from devstack import servers
from tests.e2e.conftest import CNAME_TARGET
from tests.history_payloads import encodings, readable_payloads

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TENANT = "tenant-confidential-7"


@dataclass
class Encrypted:
    pebble: servers.PebbleStack
    temporal: servers.TemporalDevServer
    env: dict[str, str]

    @property
    def client_env(self) -> dict[str, str]:
        keep = (
            "CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE",
            "CERTFLOW_PAYLOAD_KEY",
        )
        return {k: self.env[k] for k in keep}


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CERTFLOW_", "TEMPORAL_"))}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def encrypted(
    temporal: servers.TemporalDevServer,
    new_database: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Encrypted]:
    # A Pebble of its own: the session's HTTP-01 port is the deployment worker's.
    pebble = servers.start_pebble(tmp_path_factory.mktemp("codec-pebble"), nonce_reject_percent=0)
    env = servers.certflow_environment(
        pebble=pebble,
        temporal_address=temporal.address,
        database_url=new_database(),
        encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
        cname_target=CNAME_TARGET,
        task_queue=f"certflow-codec-{uuid.uuid4().hex[:6]}",
        extra={"CERTFLOW_PAYLOAD_KEY": f"e2e-1:{base64.b64encode(secrets.token_bytes(32)).decode()}"},
    )
    worker = servers.start_worker(tmp_path_factory.mktemp("codec-worker"), env)
    try:
        yield Encrypted(pebble, temporal, env)
    finally:
        worker.stop()
        pebble.stop()


async def test_no_history_on_the_task_queue_holds_a_readable_name(encrypted: Encrypted) -> None:
    hostname = f"shop.c{uuid.uuid4().hex[:10]}.test"
    encrypted.pebble.set_cname(hostname, CNAME_TARGET)
    result = _run(["starter.py", "request", hostname, "--tenant", TENANT, "--wait", "60"], encrypted.client_env)
    assert result.returncode == 0, result.stderr
    status = _run(["starter.py", "status", hostname, "--json"], encrypted.client_env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "ACTIVE"  # the CLI decodes what it reads

    conn = await asyncpg.connect(encrypted.env["CERTFLOW_DATABASE_URL"])
    try:
        account_urls = [r["account_url"] for r in await conn.fetch("SELECT account_url FROM acme_accounts")]
    finally:
        await conn.close()
    assert account_urls
    # A client without the codec: what the server stores, as any reader of it sees it.
    raw = await Client.connect(encrypted.temporal.address)
    task_queue = encrypted.env["CERTFLOW_TASK_QUEUE"]
    histories = 0
    async for execution in raw.list_workflows(f'TaskQueue="{task_queue}"'):
        history = await raw.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        histories += 1
        assert readable_payloads(history.events, [hostname, TENANT, *account_urls]) == [], execution.id
        assert encodings(history.events) <= {b"binary/encrypted"}, execution.id
    assert histories >= 1


def _wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


async def test_the_codec_server_shows_payloads_to_operators_only(encrypted: Encrypted) -> None:
    hostname = f"shop.c{uuid.uuid4().hex[:10]}.test"
    encrypted.pebble.set_cname(hostname, CNAME_TARGET)
    result = _run(["starter.py", "request", hostname, "--wait", "60"], encrypted.client_env)
    assert result.returncode == 0, result.stderr

    port = servers.free_port()
    secret = secrets.token_urlsafe(24)
    codec_env = {"CERTFLOW_PAYLOAD_KEY": encrypted.env["CERTFLOW_PAYLOAD_KEY"], "CERTFLOW_CODEC_SECRET": secret}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CERTFLOW_", "TEMPORAL_"))}
    server = subprocess.Popen(
        [sys.executable, "starter.py", "codec-server", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, env={**clean, **codec_env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        _wait_for_port(port, time.monotonic() + 30)
        temporal_cli = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
        show = [
            temporal_cli, "workflow", "show", "--address", encrypted.temporal.address,
            "--workflow-id", f"certificate:{hostname}", "--output", "json",
            "--codec-endpoint", f"http://127.0.0.1:{port}",
        ]
        decoded = subprocess.run([*show, "--codec-auth", f"Bearer {secret}"], capture_output=True, text=True, timeout=60)
        assert decoded.returncode == 0, decoded.stderr
        assert hostname in decoded.stdout

        refused = subprocess.run([*show, "--codec-auth", "Bearer not-the-secret"], capture_output=True, text=True, timeout=60)
        assert hostname not in refused.stdout
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"http://127.0.0.1:{port}/decode", json={"payloads": []})
        assert answer.status_code == 401
    finally:
        server.terminate()
        server.wait(10)
