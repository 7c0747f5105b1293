"""certflow against a Temporal that demands TLS: HAProxy (a real terminator,
devstack/temporal_tls.py) in front of the dev server, once with mTLS and once
with an API key over TLS. Through each, a worker and the CLI issue a
certificate to ACTIVE; every wrong credential is one line naming the setting to
check, exit 2, within 10 s, and nothing written.

How these go red: connect without the TLS settings (``open_temporal`` passing
``tls=False``, checked once) and both workers stop at the proxy; an SDK error
that ``_temporal_reason`` does not map fails a wrong-credential test on the
line that names no setting (as three did before the post-handshake close and
the 401 were mapped)."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from devstack import servers
from devstack.temporal_tls import TlsProxy, start_tls_proxy, write_temporal_pki
from tests.e2e.conftest import CNAME_TARGET

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ONE_LINE_WITHIN = 10.0


@dataclass
class Rig:
    pebble: servers.PebbleStack
    temporal: servers.TemporalDevServer
    mtls: TlsProxy
    api_key: TlsProxy
    database_url: str
    task_queue: str
    encryption_key: str = base64.b64encode(secrets.token_bytes(32)).decode()
    """One for every worker of the rig: they share its database."""


@pytest.fixture(scope="module")
def rig(
    temporal: servers.TemporalDevServer,
    new_database: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Rig]:
    workdir = tmp_path_factory.mktemp("temporal-tls")
    # A Pebble of its own: the session's HTTP-01 port is the deployment worker's.
    pebble = servers.start_pebble(workdir / "pebble", nonce_reject_percent=0)
    pki = write_temporal_pki(workdir / "pki")
    backend = int(temporal.address.rpartition(":")[2])
    mtls = start_tls_proxy(workdir / "mtls", backend, mode="mtls", pki=pki)
    api_key = start_tls_proxy(workdir / "api-key", backend, mode="api_key", pki=pki)
    try:
        yield Rig(pebble, temporal, mtls, api_key, new_database(), f"certflow-tls-{uuid.uuid4().hex[:6]}")
    finally:
        mtls.stop()
        api_key.stop()
        pebble.stop()


def mtls_env(rig: Rig) -> dict[str, str]:
    """mTLS as certflow's own settings say it."""
    pki = rig.mtls.pki
    return {
        "CERTFLOW_TEMPORAL_ADDRESS": rig.mtls.address,
        "CERTFLOW_TEMPORAL_TLS_CA": str(pki.server_ca),
        "CERTFLOW_TEMPORAL_TLS_SERVER_NAME": rig.mtls.server_name,
        "CERTFLOW_TEMPORAL_TLS_CERT": str(pki.client_cert),
        "CERTFLOW_TEMPORAL_TLS_KEY": str(pki.client_key),
    }


def api_key_env(rig: Rig) -> dict[str, str]:
    """An API key as the temporal CLI's variables say it (no CERTFLOW_TEMPORAL_*)."""
    assert rig.api_key.api_key is not None
    return {
        "TEMPORAL_ADDRESS": rig.api_key.address,
        "TEMPORAL_API_KEY": rig.api_key.api_key,
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(rig.api_key.pki.server_ca),
        "TEMPORAL_TLS_SERVER_NAME": rig.api_key.server_name,
    }


def _worker_env(rig: Rig, temporal: dict[str, str]) -> dict[str, str]:
    env = servers.certflow_environment(
        pebble=rig.pebble,
        temporal_address=rig.temporal.address,
        database_url=rig.database_url,
        encryption_key=rig.encryption_key,
        cname_target=CNAME_TARGET,
        task_queue=rig.task_queue,
    )
    del env["CERTFLOW_TEMPORAL_ADDRESS"]
    return {**env, **temporal}


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CERTFLOW_", "TEMPORAL_"))}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**clean, "TEMPORAL_CONFIG_FILE": os.devnull, **env},
        capture_output=True, text=True, timeout=timeout,
    )


def _cli_env(rig: Rig, temporal: dict[str, str]) -> dict[str, str]:
    return {"CERTFLOW_DATABASE_URL": rig.database_url, "CERTFLOW_TASK_QUEUE": rig.task_queue, **temporal}


@pytest.mark.parametrize("kind", ["mtls", "api_key"])
def test_a_worker_and_the_cli_issue_through_the_terminator(
    rig: Rig, kind: str, tmp_path: Path
) -> None:
    temporal = mtls_env(rig) if kind == "mtls" else api_key_env(rig)
    worker = servers.start_worker(tmp_path, _worker_env(rig, temporal), name=f"worker-{kind}")
    try:
        hostname = f"tls.c{uuid.uuid4().hex[:10]}.test"
        rig.pebble.set_cname(hostname, CNAME_TARGET)
        result = _run(["starter.py", "request", hostname, "--wait", "60"], _cli_env(rig, temporal))
        assert result.returncode == 0, result.stderr
        assert "ACTIVE" in result.stdout
    finally:
        worker.stop()
    proxy = rig.mtls if kind == "mtls" else rig.api_key
    assert proxy.log.read_text().strip(), "nothing went through the proxy"


def _wrong(rig: Rig, case: str) -> dict[str, str]:
    pki = rig.mtls.pki
    good_key = rig.api_key.api_key
    assert good_key is not None
    api = {
        "CERTFLOW_TEMPORAL_ADDRESS": rig.api_key.address,
        "CERTFLOW_TEMPORAL_TLS_CA": str(pki.server_ca),
        "CERTFLOW_TEMPORAL_TLS_SERVER_NAME": rig.api_key.server_name,
    }
    cases: dict[str, dict[str, str]] = {
        "no client certificate": {
            k: v for k, v in mtls_env(rig).items() if not k.endswith(("_CERT", "_KEY"))
        },
        "a client certificate from another CA": {
            **mtls_env(rig),
            "CERTFLOW_TEMPORAL_TLS_CERT": str(pki.other_client_cert),
            "CERTFLOW_TEMPORAL_TLS_KEY": str(pki.other_client_key),
        },
        "the wrong server name": {**mtls_env(rig), "CERTFLOW_TEMPORAL_TLS_SERVER_NAME": "not-temporal.test"},
        "a server CA that did not sign it": {**mtls_env(rig), "CERTFLOW_TEMPORAL_TLS_CA": str(pki.other_ca)},
        "a wrong API key": {**api, "CERTFLOW_TEMPORAL_API_KEY": "not-" + good_key},
        "an API key over plaintext": {**api, "CERTFLOW_TEMPORAL_API_KEY": good_key, "CERTFLOW_TEMPORAL_TLS": "false"},
        "an API key to a server without TLS": {
            "CERTFLOW_TEMPORAL_ADDRESS": rig.temporal.address, "CERTFLOW_TEMPORAL_API_KEY": good_key,
        },
    }
    return cases[case]


EXPECTED = {
    # case: (words of the reason, the setting it names)
    "no client certificate": ("client certificate", "CERTFLOW_TEMPORAL_TLS_CERT"),
    "a client certificate from another CA": ("client certificate", "CERTFLOW_TEMPORAL_TLS_CERT"),
    "the wrong server name": ("not valid for the name", "CERTFLOW_TEMPORAL_TLS_SERVER_NAME"),
    "a server CA that did not sign it": ("not signed by", "CERTFLOW_TEMPORAL_TLS_CA"),
    "a wrong API key": ("API key was refused", "CERTFLOW_TEMPORAL_API_KEY"),
    "an API key over plaintext": ("only ever sent over TLS", "CERTFLOW_TEMPORAL_API_KEY"),
    "an API key to a server without TLS": ("does not speak TLS", "CERTFLOW_TEMPORAL_ADDRESS"),
}


@pytest.mark.parametrize("case", list(EXPECTED))
async def test_a_wrong_credential_is_one_line_and_writes_nothing(rig: Rig, case: str) -> None:
    hostname = f"refused.c{uuid.uuid4().hex[:10]}.test"
    started = time.monotonic()
    result = _run(["starter.py", "request", hostname], _cli_env(rig, _wrong(rig, case)), timeout=30)
    took = time.monotonic() - started
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    words, setting = EXPECTED[case]
    assert words in lines[0] and setting in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert took < ONE_LINE_WITHIN, took

    conn = await asyncpg.connect(rig.database_url)
    try:
        exists = await conn.fetchval("SELECT to_regclass('certificates') IS NOT NULL")
        rows = await conn.fetchval("SELECT count(*) FROM certificates WHERE hostname = $1", hostname) if exists else 0
    finally:
        await conn.close()
    assert rows == 0
    client = await Client.connect(rig.temporal.address)
    with pytest.raises(RPCError):
        await client.get_workflow_handle(f"certificate:{hostname}").describe()


def test_a_worker_with_a_refused_credential_stops_with_one_line(rig: Rig) -> None:
    env = _worker_env(rig, _wrong(rig, "a client certificate from another CA"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CERTFLOW_", "TEMPORAL_"))}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "worker"], cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={**clean, "TEMPORAL_CONFIG_FILE": os.devnull, **env},
    )
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - started < ONE_LINE_WITHIN
    errors = [line for line in result.stderr.splitlines() if line.startswith("certflow:")]
    assert len(errors) == 1 and "CERTFLOW_TEMPORAL_TLS_CERT" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
