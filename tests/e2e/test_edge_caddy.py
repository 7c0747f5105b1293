"""``certflow edge --kind caddy`` beside a real Caddy (Debian's 2.6.2,
deploy/caddy/Caddyfile as shipped, only ports, upstreams and paths changed), the
deployment's worker and Pebble: what Caddy serves for each SNI, renewals and
deletes picked up with no restart, how often Caddy asks the endpoint, and that
Caddy never goes to a CA itself.

Every handshake is checked against the rows: the served leaf's serial is the
stored one, and its chain verifies to Pebble's root for that name.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from cryptography import x509

from certflow.product.client import CertflowClient
from certflow.models import Phase
from devstack import caddy as devcaddy
from devstack.servers import _tcp_open, free_port
from tests.e2e.conftest import Deployment, plant_challenge, reconcile_schedule_paused
from tests.e2e.edge_helpers import HandshakeLoop, fetch_without_redirect, plant_certificate
from tests.e2e.edge_helpers import handshake as _handshake
from tests.e2e.test_edge_files import (
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

HANDSHAKES = 20
"""Full handshakes (a new TLS session each) counted against the endpoint's answers."""
_ANSWERED = re.compile(r"answered (\d+) certificates, (\d+) not held, (\d+) refused")


@dataclass
class Edge:
    caddy: devcaddy.Caddy
    process: EdgeProcess
    listen: str
    secret: str

    def messages(self) -> list[str]:
        """The edge process's log messages so far (JSON lines)."""
        found = []
        for line in self.process.log.read_text(errors="replace").splitlines():
            try:
                found.append(str(json.loads(line).get("message", "")))
            except (ValueError, AttributeError):
                found.append(line)
        return found


@pytest.fixture(scope="module")
def edge(deployment: Deployment) -> Iterator[Edge]:
    workdir = Path(tempfile.mkdtemp(prefix="certflow-caddy-"))
    listen, secret = f"127.0.0.1:{free_port()}", secrets.token_hex(24)
    process = EdgeProcess(deployment, workdir, workdir / "edge.log")
    process.argv = [sys.executable, "starter.py", "edge", "--kind", "caddy", "--listen", listen]
    process.env["CERTFLOW_EDGE_SECRET"] = secret
    process.start()
    deadline = time.monotonic() + 30
    while not _tcp_open(int(listen.rsplit(":", 1)[1])):
        assert process.popen is not None and process.popen.poll() is None, process.log.read_text()
        assert time.monotonic() < deadline, process.log.read_text()
        time.sleep(0.1)
    responder = f"{deployment.worker.http01_host}:{deployment.worker.http01_port}"
    server = devcaddy.start_caddy(
        workdir / "caddy", edge=listen, secret=secret, default_pem=DEFAULT_PEM + DEFAULT_KEY, responder=responder
    )
    try:
        yield Edge(server, process, listen, secret)
    finally:
        server.stop()
        if process.popen is not None:
            assert process.stop() == 0, process.log.read_text()
        log = process.log.read_text()
        assert "Traceback" not in log, log
        assert "PRIVATE KEY" not in log


async def _served(edge: Edge, sni: str, root_pem: str | None = None) -> x509.Certificate:
    return await asyncio.to_thread(_handshake, edge.caddy.https_port, sni, root_pem)


async def test_each_name_gets_its_own_certificate_renewed_and_deleted_without_a_restart(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """Two hostnames issued by Pebble: each SNI gets its own stored serial, chain
    verifying to Pebble's root; a renewal is served within 5 s by the same Caddy
    process while a client handshaking in a loop sees no failure and never B's
    certificate; a delete gives the name the default certificate within 5 s. Red
    when the endpoint holds nothing (shown: ``CaddyTarget.put`` made a no-op, the
    first handshake got the default certificate)."""
    root = deployment.pebble.root_pem()
    a, b = await _issue(client, deployment, "cya"), await _issue(client, deployment, "cyb")
    pid = edge.caddy.pid
    for name in (a, b):
        serial = await _stored_serial(db, name)

        async def serves(name: str = name, serial: int | None = serial) -> bool:
            return (await _served(edge, name)).serial_number == serial

        await _until(serves, WITHIN, f"{name}'s certificate")
        assert (await _served(edge, name, root)).serial_number == serial  # verifies for name
    b_serial = (await _served(edge, b)).serial_number
    assert (await _served(edge, a)).serial_number != b_serial

    before = await _stored_serial(db, a)
    with HandshakeLoop(edge.caddy.https_port, a) as loop:
        await client.renew(a)

        async def renewed() -> bool:
            return await _stored_serial(db, a) != before

        await _until(renewed, ISSUE_WAIT, "the renewal stored")
        new = await _stored_serial(db, a)

        async def serves_new() -> bool:
            return (await _served(edge, a)).serial_number == new

        took = await _until(serves_new, WITHIN, "the renewal served")
        await asyncio.sleep(0.5)  # a few more handshakes after the swap
    print(f"\nrenewal served {took:.2f} s after it was seen stored; "
          f"{len(loop.serials)} looped handshakes, {len(loop.failures)} failed")
    assert loop.failures == []
    assert set(loop.serials) == {before, new}, "A got only its old or its new certificate, never B's"
    assert loop.serials[-1] == new
    assert (await _served(edge, a, root)).serial_number == new
    assert edge.caddy.pid == pid and edge.caddy.process.exited() is None

    state = await client.delete(b)
    assert state.phase is Phase.DELETED

    async def gone() -> bool:
        return (await _served(edge, b)).serial_number == DEFAULT_CERT.serial_number

    took = await _until(gone, WITHIN, "the deleted hostname's certificate gone")
    print(f"delete applied {took:.2f} s after it returned")
    assert (await _served(edge, a)).serial_number == new
    assert edge.caddy.pid == pid


async def test_a_wildcard_covers_one_label_and_an_exact_name_wins(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """``*.cXXXX.test`` (a planted row) and ``exact.cXXXX.test`` issued by Pebble:
    the exact name gets its own certificate, ``other.cXXXX.test`` the wildcard's,
    ``a.other.cXXXX.test`` (two labels below) and unknown names the default one.
    Red when the endpoint looks the wildcard up at any depth (shown in
    tests/unit/test_edge_caddy.py: a loop over every parent gave two labels
    below the wildcard)."""
    exact = await _issue(client, deployment, "cyexact")
    parent = exact.split(".", 1)[1]
    wildcard = f"*.{parent}"
    cert, cert_pem, key_pem = _self_signed(wildcard)
    async with reconcile_schedule_paused(client, "test_edge_caddy: a planted wildcard row"):
        await plant_certificate(db, deployment, wildcard, cert, cert_pem, key_pem)
        try:
            async def covered() -> bool:
                return (await _served(edge, f"other.{parent}")).serial_number == cert.serial_number

            await _until(covered, WITHIN, "the wildcard served")
            assert (await _served(edge, f"OTHER.{parent}")).serial_number == cert.serial_number
            assert (await _served(edge, exact)).serial_number == await _stored_serial(db, exact)
            for unknown in (f"a.other.{parent}", "unknown.example.org", "localhost"):
                assert (await _served(edge, unknown)).serial_number == DEFAULT_CERT.serial_number, unknown
        finally:
            await db.execute("DELETE FROM certificates WHERE hostname = $1", wildcard)

        async def uncovered() -> bool:
            return (await _served(edge, f"other.{parent}")).serial_number == DEFAULT_CERT.serial_number

        await _until(uncovered, WITHIN, "the wildcard's deletion applied")


async def test_port_80_routes_challenges_to_the_workers_responder(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """The shipped ``http://`` site proxies ``/.well-known/acme-challenge/*`` to the
    worker's responder with the Host kept (the responder answers only for the
    challenge's hostname), and redirects the rest to https. Red if the challenge
    route went (shown: its ``handle`` block removed, the challenge got the 301)."""
    hostname = deployment.bare_hostname("cyroute")
    async with reconcile_schedule_paused(client, "test_edge_caddy: a planted challenge"):
        certificate_id, order = await plant_challenge(db, hostname)
        try:
            base = f"http://127.0.0.1:{edge.caddy.http_port}"
            url = f"{base}/.well-known/acme-challenge/{order.token}"
            status, body, _ = await asyncio.to_thread(fetch_without_redirect, url, hostname)
            assert (status, body.decode()) == (200, order.key_authorization)
            status, _, location = await asyncio.to_thread(fetch_without_redirect, f"{base}/pricing?x=1", hostname)
            assert (status, location) == (301, f"https://{hostname}/pricing?x=1")
        finally:
            await db.execute("DELETE FROM certificates WHERE id = $1::uuid", certificate_id)


def _resumed_handshakes(port: int, sni: str, count: int) -> list[bool]:
    """One full handshake, then ``count`` more offering its session: whether each was resumed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    session = None
    reused = []
    for _ in range(count + 1):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            with context.wrap_socket(sock, server_hostname=sni, session=session) as tls:
                tls.sendall(f"GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
                while tls.recv(4096):  # TLS 1.3 tickets come after the handshake
                    pass
                if session is not None:
                    reused.append(bool(tls.session_reused))
                session = tls.session
    return reused


async def test_caddy_asks_the_endpoint_on_every_full_handshake(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """Measured: the edge restarted (its counters at zero), then 20 full handshakes
    for one name and 1 + 10 offering a session: the endpoint served one
    certificate per full handshake (Caddy 2.6.2 keeps nothing it got from a
    manager) and none per resumed one. While the edge process is down, Caddy
    serves the default certificate. Red if Caddy cached (fewer answers than full
    handshakes) or the endpoint were asked per resumption (more)."""
    name = await _issue(client, deployment, "cycount")
    serial = await _stored_serial(db, name)

    async def serves() -> bool:
        return (await _served(edge, name)).serial_number == serial

    await _until(serves, WITHIN, f"{name}'s certificate")
    assert edge.process.stop() == 0
    assert (await _served(edge, name)).serial_number == DEFAULT_CERT.serial_number  # its failure mode
    converged = sum("edge: converged" in m for m in edge.messages())
    edge.process.start()
    started = time.monotonic()

    async def converged_again() -> bool:
        return sum("edge: converged" in m for m in edge.messages()) > converged

    await _until(converged_again, 30, "the restarted edge converged")
    for _ in range(HANDSHAKES):
        assert (await _served(edge, name)).serial_number == serial
    print(f"\nrestarted edge served again {time.monotonic() - started:.2f} s after its start")
    reused = await asyncio.to_thread(_resumed_handshakes, edge.caddy.https_port, name, 10)
    assert all(reused), reused
    assert edge.process.stop() == 0
    answered = [m for m in edge.messages() if _ANSWERED.search(m)]
    found = _ANSWERED.search(answered[-1])
    assert found is not None
    served, not_held, refused = (int(n) for n in found.groups())
    print(f"{HANDSHAKES} full + 1 full and {len(reused)} resumed handshakes: the endpoint answered "
          f"{served} certificates, {not_held} not held, {refused} refused")
    edge.process.start()
    assert (served, refused) == (HANDSHAKES + 1, 0)
    await _until(serves, 30, "served again after the restart")


async def test_caddy_never_went_to_a_ca_and_logged_no_secret(edge: Edge) -> None:
    """After every test above and an unknown name's handshake: Caddy's log has no
    obtaining, issuing or on-demand line and its storage no certificate
    (auto_https off, no on_demand: certflow is the only issuer), and neither log
    holds the endpoint's secret (Go redacts the URL's password in Caddy's errors).
    Red if the file let Caddy manage names (shown: a site ``shop.example.com {
    tls internal }`` added stayed green, Caddy obtained nothing; with ``auto_https
    off`` removed as well, Caddy logged ``tls.obtain`` "obtaining certificate")."""
    assert (await _served(edge, "unknown.example.org")).serial_number == DEFAULT_CERT.serial_number
    caddy_log = edge.caddy.log_text()
    for line in caddy_log.splitlines():
        lowered = line.lower()
        assert "obtain" not in lowered and "tls.issuance" not in lowered and "on_demand" not in lowered, line
    assert not (edge.caddy.data_dir / "certificates").exists()
    assert '"got HTTP 204"' in caddy_log  # unknown names did reach the default certificate's manager
    assert edge.secret not in caddy_log
    assert edge.secret not in edge.process.log.read_text()
    if "connection refused" in caddy_log:  # the edge was down (the counting test): its URL redacted
        assert "certflow:***@" in caddy_log


def test_the_shipped_caddyfile_is_valid_and_formatted(tmp_path: Path) -> None:
    """``caddy validate`` accepts deploy/caddy/Caddyfile as shipped, and ``caddy
    fmt`` would change nothing (Caddy warns at every start otherwise). Red on a
    directive Caddy 2.6.2 does not know (shown: ``persist_config off``, a 2.6.3
    option, added to the global block: "unrecognized global option")."""
    env = {**os.environ, "CERTFLOW_EDGE_SECRET": "x" * 32, "HOME": str(tmp_path),
           "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    binary = devcaddy._binary()
    checked = subprocess.run(
        [binary, "validate", "--config", str(devcaddy.SHIPPED), "--adapter", "caddyfile"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert checked.returncode == 0 and "Valid configuration" in checked.stdout + checked.stderr, checked.stderr
    formatted = subprocess.run([binary, "fmt", str(devcaddy.SHIPPED)], env=env, capture_output=True, text=True, timeout=60)
    assert formatted.stdout == devcaddy.SHIPPED.read_text()
