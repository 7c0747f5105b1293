"""``certflow edge --kind files`` beside a real nginx (Debian's 1.22 with njs,
deploy/nginx/certflow.conf as shipped, only ports and paths changed), the
deployment's worker and Pebble: what nginx serves for each SNI, renewals and
deletes picked up with no reload, and the edge process killed and restarted.

Every handshake is checked against the rows: the served leaf's serial is the
stored one, and its chain verifies to Pebble's root for that name.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from cryptography import x509

from certflow.product.client import CertflowClient
from certflow.edge.files import FileTarget
from certflow.models import Phase
from devstack import nginx as devnginx
from devstack.pki import self_signed
from tests.e2e.conftest import Deployment, plant_challenge, reconcile_schedule_paused
from tests.e2e.edge_helpers import HandshakeLoop, fetch_without_redirect, plant_certificate
from tests.e2e.edge_helpers import handshake as _handshake

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
WITHIN = 5.0
"""A change of the rows is served by nginx within this many seconds."""
ISSUE_WAIT = 90.0


_self_signed = self_signed

DEFAULT_CERT, DEFAULT_PEM, DEFAULT_KEY = _self_signed("default.certflow.invalid")


class EdgeProcess:
    """``starter.py edge --kind files`` as a child process."""

    def __init__(self, deployment: Deployment, directory: Path, log: Path) -> None:
        self.argv = [sys.executable, "starter.py", "edge", "--kind", "files", "--dir", str(directory)]
        if os.geteuid() == 0:
            self.argv += ["--owner", devnginx.WORKER_USER]
        self.env = {**os.environ, **deployment.env, "CERTFLOW_EDGE_POLL_SECONDS": "0.5"}
        self.log = log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        assert self.popen is not None
        self.popen.send_signal(sig)
        code = self.popen.wait(15)
        self.popen = None
        return code


@dataclass
class Edge:
    nginx: devnginx.Nginx
    process: EdgeProcess
    directory: Path


@pytest.fixture(scope="module")
def edge(deployment: Deployment) -> Iterator[Edge]:
    workdir = Path(tempfile.mkdtemp(prefix="certflow-nginx-"))
    workdir.chmod(0o711)  # nginx's workers (nobody, when run as root) pass through it
    directory = workdir / "edge"
    responder = f"{deployment.worker.http01_host}:{deployment.worker.http01_port}"
    process = EdgeProcess(deployment, directory, workdir / "edge.log")
    process.start()
    deadline = time.monotonic() + 30
    while not (directory / ".certflow-edge.lock").exists():  # it made its directory
        assert time.monotonic() < deadline, process.log.read_text()
        time.sleep(0.1)
    server = devnginx.start_nginx(
        workdir / "nginx", edge_dir=directory, default_pem=DEFAULT_PEM + DEFAULT_KEY, responder=responder
    )
    try:
        yield Edge(server, process, directory)
    finally:
        server.stop()
        if process.popen is not None:
            assert process.stop() == 0, process.log.read_text()
        log = process.log.read_text()
        assert "Traceback" not in log, log
        assert "PRIVATE KEY" not in log


async def _served(edge: Edge, sni: str, root_pem: str | None = None) -> x509.Certificate:
    return await asyncio.to_thread(_handshake, edge.nginx.https_port, sni, root_pem)


async def _stored_serial(db: asyncpg.Pool, hostname: str) -> int | None:
    serial = await db.fetchval("SELECT ssl_serial FROM certificates WHERE hostname = $1", hostname)
    return None if serial is None else int(serial.replace(":", ""), 16)


async def _until(check: object, within: float, what: str) -> float:
    """Seconds until the coroutine function ``check`` returns true (at most ``within``)."""
    start = time.monotonic()
    while True:
        if await check():  # type: ignore[operator]
            return time.monotonic() - start
        assert time.monotonic() - start < within, f"{what}: not within {within} s"
        await asyncio.sleep(0.1)


async def _issue(client: CertflowClient, deployment: Deployment, label: str) -> str:
    hostname = deployment.hostname(label)
    await client.request([hostname])
    report = (await client.wait([hostname], ISSUE_WAIT))[hostname]
    assert report is not None and report.status == "ACTIVE", report
    return hostname


async def test_each_name_gets_its_own_certificate_renewed_and_deleted_without_a_reload(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """Two hostnames issued by Pebble: each SNI gets its own stored serial, chain
    verifying to Pebble's root (A never B's); a renewal is served within 5 s with
    the same nginx master (no reload) while a client doing handshakes in a loop
    through the swap sees none fail (njs reads the old file or the new one, once
    for the certificate and its key); a delete removes the file and the name gets
    the default certificate within 5 s. Red when the follower skips the push (shown:
    ``self._target.put`` commented out in ``EdgeFollower._apply``, the first
    handshake got the default certificate) or ignores the delete (shown:
    ``_remove`` out of ``follow_once``, the deleted name kept its certificate)."""
    root = deployment.pebble.root_pem()
    a, b = await _issue(client, deployment, "edgea"), await _issue(client, deployment, "edgeb")
    master = edge.nginx.master_pid
    for name in (a, b):
        serial = await _stored_serial(db, name)

        async def serves(name: str = name, serial: int | None = serial) -> bool:
            return (await _served(edge, name)).serial_number == serial

        await _until(serves, WITHIN, f"{name}'s certificate")
        assert (await _served(edge, name, root)).serial_number == serial  # verifies for name
        path = edge.directory / f"{name}.pem"
        assert path.stat().st_mode & 0o777 == 0o600
    assert (await _served(edge, a)).serial_number != (await _served(edge, b)).serial_number

    before = await _stored_serial(db, a)
    with HandshakeLoop(edge.nginx.https_port, a) as loop:
        await client.renew(a)

        async def renewed() -> bool:
            return await _stored_serial(db, a) != before

        await _until(renewed, ISSUE_WAIT, "the renewal stored")
        new = await _stored_serial(db, a)

        async def serves_new() -> bool:
            return (await _served(edge, a)).serial_number == new

        took = await _until(serves_new, WITHIN, "the renewal served")
        print(f"\nrenewal served {took:.2f} s after it was seen stored")
    assert loop.failures == [] and before in loop.serials and new in loop.serials, (
        loop.failures[:3], len(loop.serials),
    )
    assert (await _served(edge, a, root)).serial_number == new
    assert edge.nginx.master_pid == master

    state = await client.delete(b)
    assert state.phase is Phase.DELETED

    async def gone() -> bool:
        return not (edge.directory / f"{b}.pem").exists() and (
            (await _served(edge, b)).serial_number == DEFAULT_CERT.serial_number
        )

    took = await _until(gone, WITHIN, "the deleted hostname's certificate gone")
    print(f"delete applied {took:.2f} s after it returned")
    assert (await _served(edge, a)).serial_number == new
    assert edge.nginx.master_pid == master


async def test_a_wildcard_covers_one_label_and_an_exact_name_wins(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """``*.cXXXX.test`` (a row planted with the deployment's key: the edge follows
    rows, however they were issued) and ``exact.cXXXX.test`` issued by Pebble: the
    exact name gets its own certificate, ``other.cXXXX.test`` the wildcard's,
    ``a.other.cXXXX.test`` (two labels below) and an unknown name the default one.
    Red when certflow.js looks the wildcard up at any depth (shown: the one
    lookup made a loop over every parent: two labels below got the wildcard)."""
    exact = await _issue(client, deployment, "exact")
    parent = exact.split(".", 1)[1]
    wildcard = f"*.{parent}"
    cert, cert_pem, key_pem = _self_signed(wildcard)
    async with reconcile_schedule_paused(client, "test_edge_files: a planted wildcard row"):
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
    """The shipped port-80 server proxies ``/.well-known/acme-challenge/`` to the
    worker's responder with the Host kept (the responder answers only for the
    challenge's hostname), and redirects the rest to https. Red without
    ``proxy_set_header Host $host`` (shown: the responder saw the upstream's name
    and answered 404)."""
    hostname = deployment.bare_hostname("route")
    async with reconcile_schedule_paused(client, "test_edge_files: a planted challenge"):
        certificate_id, order = await plant_challenge(db, hostname)
        try:
            url = f"http://127.0.0.1:{edge.nginx.http_port}/.well-known/acme-challenge/{order.token}"
            status, body, _ = await asyncio.to_thread(fetch_without_redirect, url, hostname)
            assert (status, body.decode()) == (200, order.key_authorization)
            status, _, location = await asyncio.to_thread(
                fetch_without_redirect, f"http://127.0.0.1:{edge.nginx.http_port}/pricing?x=1", hostname
            )
            assert (status, location) == (301, f"https://{hostname}/pricing?x=1")
        finally:
            await db.execute("DELETE FROM certificates WHERE id = $1::uuid", certificate_id)


async def test_killed_mid_push_the_edge_converges_on_restart(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, edge: Edge
) -> None:
    """The edge process SIGKILLed; meanwhile a hostname is deleted, its file and a
    stray one stay, another's file is lost, and a push's temporary file is left half
    written. Restarted, it converges from the rows: the deleted and stray files
    removed, the lost one written again, the temporary one gone (that nginx never
    reads a partial file is tests/unit/test_edge_files.py's race). Red without
    the convergence's removal of what is not served (shown: that loop in
    ``EdgeFollower.converge`` emptied: the deleted and stray files stayed)."""
    keep, drop = await _issue(client, deployment, "keep"), await _issue(client, deployment, "drop")

    async def both_held() -> bool:
        return {f"{keep}.pem", f"{drop}.pem"} <= {p.name for p in edge.directory.iterdir()}

    await _until(both_held, WITHIN, "both files written")
    assert edge.process.stop(signal.SIGKILL) == -signal.SIGKILL
    await client.delete(drop)
    (edge.directory / f"{keep}.pem").unlink()
    (edge.directory / "stray.example.org.pem").write_bytes(DEFAULT_PEM + DEFAULT_KEY)
    (edge.directory / ".certflow-00000000deadbeef.tmp").write_bytes(DEFAULT_PEM[:100])
    edge.process.start()

    async def converged() -> bool:
        names = {p.name for p in edge.directory.iterdir()}
        return f"{keep}.pem" in names and f"{drop}.pem" not in names and "stray.example.org.pem" not in names

    await _until(converged, 30, "converged after the restart")
    assert not (edge.directory / ".certflow-00000000deadbeef.tmp").exists()
    assert (await _served(edge, keep, deployment.pebble.root_pem())).serial_number == await _stored_serial(db, keep)


async def test_a_file_replaced_under_a_flood_of_handshakes_never_fails_one() -> None:
    """nginx loads a handshake's certificate and key from the one read njs makes
    (``data:$certflow_certificate`` for both), so the file renamed between nginx's
    certificate read and its key read cannot pair one certificate with another's
    key. Here the files target replaces one name's file 4,000 times, alternating
    two certificates with different keys, while a thread does full handshakes:
    none fails, and both certificates are seen. Red with the shipped config
    naming the file's path for ``ssl_certificate`` and ``ssl_certificate_key``
    (two opens: TLSV1_ALERT_INTERNAL_ERROR, "key values mismatch" in nginx's log),
    as it did until a CI run met it once in the renewal test above."""
    workdir = Path(tempfile.mkdtemp(prefix="certflow-nginx-"))
    workdir.chmod(0o711)  # nginx's workers (nobody, when run as root) pass through it
    directory = workdir / "edge"
    directory.mkdir()
    owner = None
    if os.geteuid() == 0:  # nginx's workers read what the target writes
        import grp
        import pwd

        owner = (pwd.getpwnam(devnginx.WORKER_USER).pw_uid, grp.getgrnam(devnginx.WORKER_GROUP).gr_gid)
        os.chown(directory, *owner)
    target = FileTarget(directory, owner)
    name = "swap.certflow.test"
    bundles = [_self_signed(name) for _ in range(2)]
    server = devnginx.start_nginx(
        workdir / "nginx", edge_dir=directory, default_pem=DEFAULT_PEM + DEFAULT_KEY, responder="127.0.0.1:9"
    )
    try:
        await target.put(name, bundles[0][1].decode(), bundles[0][2])
        with HandshakeLoop(server.https_port, name) as loop:
            for n in range(4000):
                _, chain, key = bundles[n % 2 - 1]
                await target.put(name, chain.decode(), key)
        assert loop.failures == [], (loop.failures[:3], len(loop.failures), len(loop.serials))
        assert {bundle[0].serial_number for bundle in bundles} <= set(loop.serials)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
