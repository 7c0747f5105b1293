"""Postgres over TLS (``sslmode=verify-full``) on a cluster that accepts TLS only.

The cluster (devstack/postgres_tls.py) has ``ssl = on``, no Unix socket and only
``hostssl`` lines in pg_hba.conf; the ``certflow`` role logs in by client
certificate. ``migrate``, the worker, the CLI and the edge all use the same
verify-full URL. A plaintext URL, a wrong CA and a missing client certificate
each end the CLI with one line naming CERTFLOW_DATABASE_URL and what to check.

Shown red: with a ``host all all 127.0.0.1/32 trust`` line added to the cluster's
pg_hba.conf, the plaintext case migrated (exit 0) and its test failed; with
``TlsPostgres.url`` always naming the right CA as sslrootcert, the wrong-CA case
migrated (exit 0). Both put back. Before open_postgres named sslrootcert, the
wrong CA's line ended "TLS failed: CERTIFICATE_VERIFY_FAILED".
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from cryptography import x509

from certflow.connect.connections import open_postgres, redact_url
from certflow.crypto import EncryptionKey
from certflow.edge.serving import SniCertificates
from devstack import servers
from devstack.postgres_tls import TlsPostgres, start_tls_postgres

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BOUND_SECONDS = 10.0
"""From the subprocess's start: a bound on a hang, not a speed target."""
CNAME_TARGET = "edge.saas.test"


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsPostgres]:
    server = start_tls_postgres(tmp_path_factory.mktemp("postgres-tls"))
    try:
        yield server
    finally:
        server.stop()


def _database(tls_postgres: TlsPostgres) -> str:
    """A fresh database owned by ``certflow``; returns its name."""
    name = f"certflow_tls_{uuid.uuid4().hex[:10]}"
    tls_postgres.create_database(name)
    return name


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CERTFLOW_", "PGSSL"))}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "starter.py", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, time.monotonic() - started


async def _migrations_table(tls_postgres: TlsPostgres, database: str) -> str | None:
    """schema_migrations (certflow/store/db.py) in that database, or None: read
    over verify-full as the superuser."""
    conn = await asyncpg.connect(tls_postgres.url(database))
    try:
        found: str | None = await conn.fetchval("SELECT to_regclass('public.schema_migrations')::text")
        return found
    finally:
        await conn.close()


async def test_migrate_over_verify_full_with_a_client_certificate(tls_postgres: TlsPostgres) -> None:
    """``starter.py migrate`` with sslmode=verify-full, sslrootcert and a client
    certificate applies every migration; the same again has nothing to do.

    Fails if asyncpg stops reading sslrootcert/sslcert/sslkey from the URL (no
    client certificate: the ``cert`` line refuses ``certflow``), or if the
    server's certificate stops naming localhost (verify-full refuses it)."""
    database = _database(tls_postgres)
    env = {"CERTFLOW_DATABASE_URL": tls_postgres.client_url(database)}
    result, _ = _run(["migrate", "--json"], env)
    assert result.returncode == 0, result.stderr
    applied = json.loads(result.stdout)["applied"]
    migrations = sorted(p.name for p in (ROOT / "certflow/store/migrations").glob("*.sql"))
    assert applied == migrations
    assert await _migrations_table(tls_postgres, database) == "schema_migrations"

    again, _ = _run(["migrate"], env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "schema is up to date"


@pytest.mark.parametrize("case", ["plaintext", "wrong CA", "no client certificate"])
async def test_a_refused_connection_is_one_line_and_writes_nothing(
    tls_postgres: TlsPostgres, case: str
) -> None:
    """``starter.py migrate`` whose connection the TLS-only cluster refuses (or
    the client refuses, for the wrong CA): exit 2, one line on stderr naming
    CERTFLOW_DATABASE_URL and the URL parameter to check, no traceback, within
    10 s, and no schema_migrations in the (fresh) database afterwards.

    Fails if pg_hba.conf gets a ``host`` line (plaintext migrates, exit 0); if the
    client stops verifying against sslrootcert (the wrong CA migrates); if
    open_postgres lets ssl.SSLCertVerificationError through (a traceback, exit 1)
    or loses its TLS reasons (the line no longer says what to check)."""
    database = _database(tls_postgres)
    if case == "plaintext":
        url = tls_postgres.client_url(database, sslmode="disable")
        prefix = (
            f'no pg_hba.conf entry for host "127.0.0.1", user "certflow", database "{database}",'
            " no encryption; the server accepts TLS only: check sslmode (verify-full, with sslrootcert)"
        )
        suffix = ""
    elif case == "wrong CA":
        url = tls_postgres.client_url(database, rootcert=tls_postgres.wrong_ca)
        # OpenSSL's own words go in the brackets (which depend on its version).
        prefix = "TLS failed: the server's certificate is not signed by the CA in sslrootcert ("
        suffix = "); check sslrootcert"
    else:
        url = tls_postgres.url(database, user="certflow")
        prefix, suffix = "connection requires a valid client certificate; check sslcert and sslkey", ""
    result, took = _run(["migrate"], {"CERTFLOW_DATABASE_URL": url})

    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    head = f"certflow: cannot connect to Postgres at {redact_url(url)} (CERTFLOW_DATABASE_URL): "
    assert line.startswith(head + prefix) and line.endswith(suffix), line
    assert took < BOUND_SECONDS, took
    assert result.stdout == ""
    assert await _migrations_table(tls_postgres, database) is None


async def test_a_worker_with_the_wrong_ca_stops_in_one_line(
    tls_postgres: TlsPostgres, temporal: servers.TemporalDevServer
) -> None:
    """``worker.py`` with the wrong CA's sslrootcert: exit 2 within 10 s, one line
    naming CERTFLOW_DATABASE_URL and sslrootcert, no traceback, nothing migrated.

    Fails if the worker opens its pool without open_postgres (the
    SSLCertVerificationError is a traceback) or stops verifying the server."""
    database = _database(tls_postgres)
    url = tls_postgres.client_url(database, rootcert=tls_postgres.wrong_ca)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CERTFLOW_", "PGSSL"))}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env={
            **clean,
            "CERTFLOW_DATABASE_URL": url,
            "CERTFLOW_ENCRYPTION_KEY": base64.b64encode(bytes(32)).decode(),
            "CERTFLOW_TEMPORAL_ADDRESS": temporal.address,
            "CERTFLOW_TASK_QUEUE": f"certflow-pgtls-{uuid.uuid4().hex[:6]}",
            # Never reached: nothing goes on without Postgres.
            "CERTFLOW_ACME_DIRECTORY_URL": f"https://127.0.0.1:{servers.free_port()}/dir",
            "CERTFLOW_CNAME_TARGET": CNAME_TARGET,
            "CERTFLOW_DNS_RESOLVER": f"127.0.0.1:{servers.free_port()}",
            "CERTFLOW_HTTP01_LISTEN": f"127.0.0.1:{servers.free_port()}",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    head = f"certflow: cannot connect to Postgres at {redact_url(url)} (CERTFLOW_DATABASE_URL): "
    assert lines[0].startswith(head + "TLS failed: the server's certificate is not signed by the CA in sslrootcert ("), lines[0]
    assert lines[0].endswith("); check sslrootcert"), lines[0]
    assert took < BOUND_SECONDS, took
    assert await _migrations_table(tls_postgres, database) is None


async def _served_serial(edge: SniCertificates, hostname: str, root_pem: str) -> int:
    """The serial of the certificate a TLS server using ``edge.sni_callback`` serves
    for hostname, verified against the CA's root and the name."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.sni_callback = edge.sni_callback

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
    try:
        port = server.sockets[0].getsockname()[1]
        client_context = ssl.create_default_context(cadata=root_pem)
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname=hostname
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return int(x509.load_der_x509_certificate(der).serial_number)
    finally:
        server.close()
        await server.wait_closed()


async def test_issuance_with_the_worker_the_cli_and_the_edge_over_verify_full(
    tls_postgres: TlsPostgres,
    temporal: servers.TemporalDevServer,
    tmp_path: Path,
) -> None:
    """A worker, the CLI and the edge, all on the verify-full URL with a client
    certificate: the worker migrates and serves; ``request --wait`` reaches ACTIVE;
    ``status --json`` reads the row; SniCertificates loads it and a TLS handshake
    for the hostname gets that certificate. Every one of the worker's sessions is
    TLS with the client certificate (pg_stat_ssl).

    Its own Pebble: the session's HTTP-01 port belongs to the deployment's worker.
    Fails if any of the worker, the CLI or the edge connects another way than the
    URL says (a plaintext connection is refused by the cluster; no client
    certificate, by the ``cert`` line), or if the worker cannot issue over TLS."""
    database = _database(tls_postgres)
    url = tls_postgres.client_url(database)
    raw_key = secrets.token_bytes(32)
    pebble = servers.start_pebble(tmp_path / "pebble", nonce_reject_percent=0)
    try:
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=url,
            encryption_key=base64.b64encode(raw_key).decode(),
            cname_target=CNAME_TARGET,
            task_queue=f"certflow-pgtls-{uuid.uuid4().hex[:6]}",
            extra={
                "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
                "CERTFLOW_RENEWAL_INFO_SWEEP_SECONDS": "0",
                "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
                "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
            },
        )
        worker = servers.start_worker(tmp_path / "worker", env, name="worker-pgtls")
        try:
            admin = await asyncpg.connect(tls_postgres.url(database))
            try:
                sessions = await admin.fetch(
                    "SELECT s.ssl, s.client_dn FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
                    " WHERE a.datname = $1 AND a.usename = 'certflow'",
                    database,
                )
            finally:
                await admin.close()
            assert sessions, "the worker holds a session (its pool's minimum)"
            assert {(r["ssl"], r["client_dn"]) for r in sessions} == {(True, "/CN=certflow")}

            hostname = f"pgtls.c{uuid.uuid4().hex[:10]}.test"
            pebble.set_cname(hostname, CNAME_TARGET)
            client_env = {
                k: env[k]
                for k in ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE")
            }
            requested, _ = _run(["request", hostname, "--wait", "60"], client_env)
            assert requested.returncode == 0, (requested.stdout, requested.stderr, worker.log.read_text()[-3000:])
            assert "ACTIVE" in requested.stdout
            shown, _ = _run(["status", hostname, "--json"], client_env)
            assert shown.returncode == 0, shown.stderr
            status = json.loads(shown.stdout)
            assert status["status"] == "ACTIVE" and status["serial"], status
        finally:
            worker.stop()

        pool = await open_postgres(url, max_size=2)
        try:
            edge = SniCertificates(pool, EncryptionKey(raw_key))
            assert await edge.refresh() >= 1
            assert edge.serial_for(hostname) == status["serial"]
            served = await _served_serial(edge, hostname, pebble.root_pem())
            assert format(served, "x") == status["serial"]
        finally:
            await pool.close()
    finally:
        pebble.stop()
