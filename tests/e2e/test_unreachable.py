"""A Postgres or Temporal the CLI cannot reach: one line naming the address and the
setting, exit 2, within a bound (issue 26) — for every command, and the same as a
typed error from ``CertflowClient.connect``.

Every command connects to Postgres first (``CertflowClient.connect``, and
``migrate``/``rotate-keys`` use only Postgres), so a closed Postgres port needs no
server; the Temporal cases need a Postgres that answers: the session's
(``DATABASE_URL`` when set, else the embedded one tests/conftest.py starts).

Checked: with cli.main's ``except ServiceUnreachableError`` removed, both
closed-port tests failed at their first command (a traceback, exit 1); restored.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from certflow.product.commands import COMMANDS
from certflow.product.client import CertflowClient
from certflow.connect.connections import redact_url
from certflow.errors import CertflowError, ServiceUnreachableError
from certflow.connect.settings import ClientSettings

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BOUND_SECONDS = 10.0
"""From the subprocess's start: a bound on a hang, not a speed target."""

ARGS: dict[str, list[str]] = {
    "request": ["request", "a.example.com"],
    "check": ["check", "a.example.com"],
    "status": ["status", "a.example.com"],
    "list": ["list"],
    "events": ["events", "a.example.com"],
    "retry": ["retry", "a.example.com"],
    "renew": ["renew", "a.example.com"],
    "transfer": ["transfer", "a.example.com", "--to", "t-2"],
    "cancel": ["cancel", "a.example.com"],
    "delete": ["delete", "a.example.com"],
    "cooldown": ["cooldown"],
    "reconcile": ["reconcile"],
    "rotate-keys": ["rotate-keys"],
    "migrate": ["migrate"],
    "migrate-runs": ["migrate-runs"],
}
POSTGRES_ONLY = {"rotate-keys", "migrate"}
CONNECTS_NOWHERE = {"codec-server", "edge"}
"""Not one-shot: the codec server needs neither Postgres nor Temporal
(tests/unit/test_payload_codec.py); the edge logs an unreachable Postgres and
retries, keeping what the edge holds (tests/unit/test_edge_maintain.py)."""


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_timed(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "starter.py", *args],
        cwd=ROOT,
        env={
            **clean,
            "CERTFLOW_ENCRYPTION_KEY": base64.b64encode(bytes(32)).decode(),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, time.monotonic() - started


def _assert_one_line(
    result: subprocess.CompletedProcess[str], took: float, expected: str, command: str
) -> None:
    assert result.returncode == 2, (command, result.returncode, result.stderr[-2000:])
    assert result.stderr.strip() == expected, (command, result.stderr[-2000:])
    assert took < BOUND_SECONDS, (command, took)


def test_every_command_is_listed() -> None:
    assert set(ARGS) | CONNECTS_NOWHERE == set(COMMANDS)


def test_postgres_on_a_closed_port() -> None:
    port = _closed_port()
    url = f"postgresql://certflow:hunter2@127.0.0.1:{port}/certflow"
    expected = (
        f"certflow: cannot reach Postgres at postgresql://certflow@127.0.0.1:{port}/certflow"
        " (CERTFLOW_DATABASE_URL): connection refused"
    )
    for command, args in ARGS.items():
        result, took = _run_timed(args, {"CERTFLOW_DATABASE_URL": url})
        _assert_one_line(result, took, expected, command)
        assert "hunter2" not in result.stderr + result.stdout


def test_temporal_on_a_closed_port(postgres_admin_url: str) -> None:
    port = _closed_port()
    env = {"CERTFLOW_DATABASE_URL": postgres_admin_url, "CERTFLOW_TEMPORAL_ADDRESS": f"127.0.0.1:{port}"}
    expected = (
        f"certflow: cannot reach Temporal at 127.0.0.1:{port} (CERTFLOW_TEMPORAL_ADDRESS):"
        " connection refused"
    )
    for command, args in ARGS.items():
        if command in POSTGRES_ONLY:
            continue
        result, took = _run_timed(args, env)
        _assert_one_line(result, took, expected, command)


# -- the typed error, in process ---------------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel completes the handshake) and
    never answers: what a firewall that drops replies looks like to a client."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


@pytest.fixture
async def tls_refusing_port() -> AsyncIterator[int]:
    """A "Postgres" that agrees to TLS ('S') and then speaks plain bytes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(8)  # SSLRequest
        writer.write(b"S")
        await writer.drain()
        await reader.read(4096)  # the client's TLS hello
        writer.write(b"this is not a TLS server hello\r\n" * 8)
        await writer.drain()
        await reader.read(4096)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def _connect_error(settings: ClientSettings, timeout: float = 2.0) -> ServiceUnreachableError:
    started = time.monotonic()
    with pytest.raises(ServiceUnreachableError) as caught:
        await CertflowClient.connect(settings, timeout=timeout)
    assert time.monotonic() - started < timeout + 2
    assert isinstance(caught.value, CertflowError)
    return caught.value


async def test_postgres_dns_failure_is_typed() -> None:
    err = await _connect_error(
        ClientSettings(database_url="postgresql://u:pw@certflow-nowhere.invalid:5432/db")
    )
    assert (err.service, err.setting) == ("Postgres", "CERTFLOW_DATABASE_URL")
    assert err.address == "postgresql://u@certflow-nowhere.invalid:5432/db"
    assert err.reason.startswith("the name does not resolve (DNS")
    assert "pw" not in str(err).replace("postgresql", "")


async def test_postgres_silence_is_a_bounded_timeout(silent_port: int) -> None:
    err = await _connect_error(
        ClientSettings(database_url=f"postgresql://u@127.0.0.1:{silent_port}/db"), timeout=1.0
    )
    assert err.reason == "no answer within 1 s", err


async def test_postgres_tls_failure_is_typed(tls_refusing_port: int) -> None:
    err = await _connect_error(
        ClientSettings(database_url=f"postgresql://u@127.0.0.1:{tls_refusing_port}/db?sslmode=require")
    )
    assert err.reason.startswith("TLS failed"), err


async def test_temporal_dns_failure_and_silence_are_typed(postgres_admin_url: str, silent_port: int) -> None:
    err = await _connect_error(
        ClientSettings(database_url=postgres_admin_url, temporal_address="certflow-nowhere.invalid:7233")
    )
    assert (err.service, err.setting, err.reason) == (
        "Temporal", "CERTFLOW_TEMPORAL_ADDRESS", "the name does not resolve (DNS)"
    )
    err = await _connect_error(
        ClientSettings(database_url=postgres_admin_url, temporal_address=f"127.0.0.1:{silent_port}"),
        timeout=1.0,
    )
    assert err.reason == "no answer within 1 s", err


def test_redact_url_keeps_no_password() -> None:
    assert redact_url("postgresql://a:b@h:5/d") == "postgresql://a@h:5/d"
    assert redact_url("postgresql://a@h/d?password=b&sslmode=require") == (
        "postgresql://a@h/d?password=***&sslmode=require"
    )
    assert redact_url("postgresql://postgres:@/postgres?host=/run/pg") == (
        "postgresql://postgres@/postgres?host=/run/pg"
    )
