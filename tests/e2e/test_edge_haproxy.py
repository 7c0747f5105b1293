"""``certflow edge --kind haproxy`` beside a real HAProxy (Debian's 2.6, in
master-worker mode, deploy/haproxy/certflow.cfg as shipped, only ports and
paths changed), the deployment's worker and Pebble: what HAProxy serves for each
SNI, renewals and deletes pushed over the runtime API with no reload, HAProxy
restarted, and the edge process killed during a burst of renewals.

Every handshake is checked against the rows: the served leaf's serial is the
stored one, and its chain verifies to Pebble's root for that name.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from cryptography import x509

from certflow.product.client import CertflowClient
from certflow.edge.haproxy import RuntimeApi
from certflow.models import Phase
from devstack import haproxy as devhaproxy
from devstack.servers import free_port
from devstack.temporal_tls import _find_haproxy
from tests.e2e.conftest import Deployment, plant_challenge, reconcile_schedule_paused
from tests.e2e.edge_helpers import HandshakeLoop, fetch_without_redirect, plant_certificate
from tests.e2e.edge_helpers import handshake as _handshake
from tests.e2e.test_edge_files import (
    REPO,
    DEFAULT_CERT,
    DEFAULT_KEY,
    DEFAULT_PEM,
    ISSUE_WAIT,
    WITHIN,
    EdgeProcess,
    _issue,
    _self_signed,
    _stored_serial,
    _until,
)

pytestmark = pytest.mark.e2e

RESTART_WITHIN = 10.0
"""After HAProxy restarts, every certificate is served again within this many seconds."""


@dataclass
class Edge:
    haproxy: devhaproxy.HAProxy
    process: EdgeProcess
    metrics_port: int

    def metric(self, name: str) -> float | None:
        """A metric of this edge, as Prometheus scrapes it."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") and 'edge="test-haproxy"' in line:
                return float(line.rsplit(" ", 1)[1])
        return None


@pytest.fixture(scope="module")
def edge(deployment: Deployment) -> Iterator[Edge]:
    workdir = Path(tempfile.mkdtemp(prefix="certflow-haproxy-"))
    responder = f"{deployment.worker.http01_host}:{deployment.worker.http01_port}"
    server = devhaproxy.start_haproxy(workdir / "haproxy", default_pem=DEFAULT_PEM + DEFAULT_KEY, responder=responder)
    process = EdgeProcess(deployment, workdir, workdir / "edge.log")
    process.argv = [
        sys.executable, "starter.py", "edge", "--kind", "haproxy",
        "--socket", str(server.socket), "--crt-list", str(server.crt_list),
    ]
    metrics_port = free_port()
    process.env.update(
        CERTFLOW_EDGE_NAME="test-haproxy",
        CERTFLOW_EDGE_ADDRESS=f"127.0.0.1:{server.https_port}",
        CERTFLOW_EDGE_METRICS_LISTEN=f"127.0.0.1:{metrics_port}",
    )
    process.start()
    try:
        yield Edge(server, process, metrics_port)
    finally:
        if process.popen is not None:
            assert process.stop() == 0, process.log.read_text()
        server.stop()
        log = process.log.read_text()
        assert "Traceback" not in log, log
        assert "PRIVATE KEY" not in log


async def _served_serial(edge: Edge, sni: str, root_pem: str | None = None) -> int:
    return (await asyncio.to_thread(_handshake, edge.haproxy.https_port, sni, root_pem)).serial_number


def _reloads(edge: Edge) -> int:
    return edge.haproxy.log.read_text(errors="replace").count("Reexecuting Master process")


async def test_each_name_gets_its_own_certificate_renewed_and_deleted_without_a_reload(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """Two hostnames issued by Pebble: each SNI gets its own stored serial, its
    chain verifying to Pebble's root (A never B's); a renewal is served within 5 s
    while a client does handshakes in a loop through the swap, none failing, the
    master the same and no reload in its log; a delete gives the name the default
    certificate within 5 s. Red when the follower skips the push (shown:
    ``await self._target.put`` replaced by ``pass`` in ``EdgeFollower._apply``:
    the first handshake got the default certificate until the deadline) or ignores
    the delete (shown: ``del ssl crt-list`` skipped in ``HAProxyTarget.remove``:
    the deleted name kept its certificate)."""
    root = deployment.pebble.root_pem()
    a, b = await _issue(client, deployment, "hpa"), await _issue(client, deployment, "hpb")
    master, reloads = edge.haproxy.master_pid, _reloads(edge)
    for name in (a, b):
        serial = await _stored_serial(db, name)

        async def serves(name: str = name, serial: int | None = serial) -> bool:
            return await _served_serial(edge, name) == serial

        await _until(serves, WITHIN, f"{name}'s certificate")
        assert await _served_serial(edge, name, root) == serial  # verifies for name
    assert await _served_serial(edge, a) != await _served_serial(edge, b)

    before = await _stored_serial(db, a)
    with HandshakeLoop(edge.haproxy.https_port, a) as loop:
        await client.renew(a)

        async def renewed() -> bool:
            return await _stored_serial(db, a) != before

        await _until(renewed, ISSUE_WAIT, "the renewal stored")
        new = await _stored_serial(db, a)

        async def serves_new() -> bool:
            return await _served_serial(edge, a) == new

        took = await _until(serves_new, WITHIN, "the renewal served")
        print(f"\nrenewal served {took:.2f} s after it was seen stored")
    assert loop.failures == [] and before in loop.serials and new in loop.serials, (
        loop.failures[:3], len(loop.serials),
    )
    print(f"{len(loop.serials)} handshakes through the swap, none failed")
    assert await _served_serial(edge, a, root) == new
    assert (edge.haproxy.master_pid, _reloads(edge)) == (master, reloads)
    stored_hex = await db.fetchval("SELECT ssl_serial FROM certificates WHERE hostname = $1", a)
    status = await asyncio.to_thread(
        subprocess.run, [sys.executable, "starter.py", "status", a], cwd=REPO, env=edge.process.env,
        capture_output=True, text=True, timeout=60,
    )
    line = f"edge test-haproxy (haproxy, 127.0.0.1:{edge.haproxy.https_port}): serves the current certificate"
    assert f"{line} (serial {stored_hex})" in status.stdout, status.stdout + status.stderr

    async def reported() -> bool:  # the metrics follow every 10 s
        held = edge.metric("certflow_edge_certificates_held")
        return held is not None and held >= 2

    await _until(reported, 15, "the certificates held reported")
    lag = edge.metric("certflow_edge_lag_seconds")
    assert lag is not None and lag < 15, lag

    state = await client.delete(b)
    assert state.phase is Phase.DELETED

    async def gone() -> bool:
        return await _served_serial(edge, b) == DEFAULT_CERT.serial_number

    took = await _until(gone, WITHIN, "the deleted hostname's certificate gone")
    print(f"delete applied {took:.2f} s after it returned")
    assert await _served_serial(edge, a) == new
    assert edge.haproxy.master_pid == master


async def test_a_wildcard_covers_one_label_and_an_exact_name_wins(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """``*.cXXXX.test`` (a planted row) and ``exact.cXXXX.test`` issued by Pebble:
    the exact name gets its own certificate, ``other.`` the wildcard's, two labels
    below and an unknown name the default one. Red when the crt-list line has no
    SNI filter (shown: the line added without the payload form, so HAProxy took
    the names from the certificate itself and ``exact`` was no longer its own
    when the wildcard's certificate also named it)."""
    exact = await _issue(client, deployment, "hpexact")
    parent = exact.split(".", 1)[1]
    wildcard = f"*.{parent}"
    cert, cert_pem, key_pem = _self_signed(wildcard)
    async with reconcile_schedule_paused(client, "test_edge_haproxy: a planted wildcard row"):
        await plant_certificate(db, deployment, wildcard, cert, cert_pem, key_pem)
        try:
            async def covered() -> bool:
                return await _served_serial(edge, f"other.{parent}") == cert.serial_number

            await _until(covered, WITHIN, "the wildcard served")
            assert await _served_serial(edge, f"OTHER.{parent}") == cert.serial_number
            assert await _served_serial(edge, exact) == await _stored_serial(db, exact)
            for unknown in (f"a.other.{parent}", "unknown.example.org", "localhost"):
                assert await _served_serial(edge, unknown) == DEFAULT_CERT.serial_number, unknown
        finally:
            await db.execute("DELETE FROM certificates WHERE hostname = $1", wildcard)

        async def uncovered() -> bool:
            return await _served_serial(edge, f"other.{parent}") == DEFAULT_CERT.serial_number

        await _until(uncovered, WITHIN, "the wildcard's deletion applied")


async def test_port_80_routes_challenges_to_the_workers_responder(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """The shipped port-80 frontend sends ``/.well-known/acme-challenge/`` to the
    worker's responder with the Host kept, and redirects the rest to https. Red
    without the ``use_backend certflow_responder`` line (shown: the challenge got
    the redirect, as the CA would)."""
    hostname = deployment.bare_hostname("hproute")
    async with reconcile_schedule_paused(client, "test_edge_haproxy: a planted challenge"):
        certificate_id, order = await plant_challenge(db, hostname)
        try:
            base = f"http://127.0.0.1:{edge.haproxy.http_port}"
            status, body, _ = await asyncio.to_thread(
                fetch_without_redirect, f"{base}/.well-known/acme-challenge/{order.token}", hostname
            )
            assert (status, body.decode()) == (200, order.key_authorization)
            status, _, location = await asyncio.to_thread(fetch_without_redirect, f"{base}/pricing?x=1", hostname)
            assert (status, location) == (301, f"https://{hostname}/pricing?x=1")
        finally:
            await db.execute("DELETE FROM certificates WHERE id = $1::uuid", certificate_id)


async def test_haproxy_restarted_gets_every_certificate_again(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """HAProxy stopped and started (what was pushed lives in its memory only): every
    certificate served again within 10 s, with no restart of ``certflow edge``,
    whose log says so in one line. Red without the restart check (shown:
    ``HAProxyTarget.restarted`` returning False: the names got the default
    certificate until the deadline)."""
    name = await _issue(client, deployment, "hprestart")
    serial = await _stored_serial(db, name)

    async def serves() -> bool:
        return await _served_serial(edge, name) == serial

    await _until(serves, WITHIN, "served before the restart")
    edge_pid = edge.process.popen.pid if edge.process.popen else None
    edge.haproxy.stop()
    edge.haproxy.start()
    took = await _until(serves, RESTART_WITHIN, "served again after HAProxy restarted")
    print(f"\nserved again {took:.2f} s after HAProxy accepted connections")
    assert edge.process.popen is not None and edge.process.popen.pid == edge_pid
    assert "pushing everything again" in edge.process.log.read_text()


async def test_killed_during_a_burst_of_renewals_the_edge_converges_on_restart(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """50 rows renewed at once (a new certificate and serial each, written as the
    worker writes them) while ``certflow edge`` pushes them: SIGKILLed mid-burst,
    restarted, HAProxy ends up serving exactly the current serial of each, and no
    transaction is left open. Red without the start's convergence (shown:
    ``must_converge`` starting False: the names pushed after the kill kept their
    old certificates)."""
    parent = deployment.bare_hostname("burst")
    names = [f"r{i}.{parent}" for i in range(50)]
    first = {n: _self_signed(n) for n in names}
    second = {n: _self_signed(n) for n in names}

    async def plant(certs: dict[str, tuple[x509.Certificate, bytes, bytes]], insert: bool) -> None:
        rows = [
            (n, pem.decode(), deployment.encryption_key.encrypt(key), format(c.serial_number, "x"))
            for n, (c, pem, key) in certs.items()
        ]
        if insert:
            await db.executemany(
                """INSERT INTO certificates (hostname, status, ssl_certificate, ssl_certificate_chain,
                       encrypted_ssl_private_key, ssl_serial, ssl_expires_at, workflow_seen_at)
                   VALUES ($1, 'ACTIVE', $2, '', $3, $4, now() + interval '30 days', now())""",
                rows,
            )
        else:
            await db.executemany(
                """UPDATE certificates SET ssl_certificate = $2, encrypted_ssl_private_key = $3,
                       ssl_serial = $4 WHERE hostname = $1""",
                rows,
            )

    async with reconcile_schedule_paused(client, "test_edge_haproxy: a burst of planted renewals"):
        await plant(first, insert=True)
        try:
            async def all_first() -> bool:
                return await _served_serial(edge, names[-1]) == first[names[-1]][0].serial_number

            await _until(all_first, 30, "the first 50 served")
            mark = len(edge.process.log.read_text())
            await plant(second, insert=False)  # one transaction: the follower gets all 50 at once
            while "pushed r" not in edge.process.log.read_text()[mark:]:
                await asyncio.sleep(0.01)
            assert edge.process.stop(signal.SIGKILL) == -signal.SIGKILL
            pushed = edge.process.log.read_text()[mark:].count("pushed r")
            print(f"\nkilled after {pushed} of 50 renewals pushed")
            edge.process.start()

            async def exactly_current() -> bool:
                served = await asyncio.gather(*(_served_serial(edge, n) for n in names))
                return served == [second[n][0].serial_number for n in names]

            took = await _until(exactly_current, 30, "every name's current serial after the restart")
            print(f"converged {took:.2f} s after the restart")
            assert "# transaction\n*" not in await _runtime(edge, "show ssl cert")
        finally:
            await db.execute("DELETE FROM certificates WHERE hostname LIKE $1", f"%.{parent}")


async def _runtime(edge: Edge, command: str) -> str:
    api = await RuntimeApi.open(str(edge.haproxy.socket))
    try:
        return await api.command(command)
    finally:
        await api.close()


def test_the_shipped_configuration_is_valid_as_is(tmp_path: Path) -> None:
    """``haproxy -c`` on deploy/haproxy/certflow.cfg with only paths changed: a
    shipped file HAProxy would refuse fails here."""
    text = devhaproxy.shipped_config(
        tmp_path, socket=tmp_path / "admin.sock", default_pem=tmp_path / "default.pem",
        crt_list=tmp_path / "l", responder="127.0.0.1:8402", app="127.0.0.1:8080",
        http_port=80, https_port=443,
    )
    (tmp_path / "default.pem").write_bytes(DEFAULT_PEM + DEFAULT_KEY)
    (tmp_path / "l").touch()
    (tmp_path / "h.cfg").write_text(text)
    done = subprocess.run([_find_haproxy(), "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.path.getsize(tmp_path / "l") == 0
