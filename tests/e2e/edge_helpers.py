"""What the edge tests (test_edge_files.py, test_edge_haproxy.py,
test_edge_caddy.py) share beyond test_edge_files' own helpers: a handshake with
an SNI and a loop of them, a plain HTTP request to an edge's port 80, and a
certificate row planted directly (the edge follows rows, however they were issued)."""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.error
import urllib.request

import asyncpg
from cryptography import x509

from tests.e2e.conftest import Deployment


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def fetch_without_redirect(url: str, host: str) -> tuple[int, bytes, str | None]:
    """(status, body, Location) of a GET with that Host header, redirects not
    followed and no proxy."""
    request = urllib.request.Request(url, headers={"Host": host})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())
    try:
        with opener.open(request, timeout=10) as answer:
            return answer.status, answer.read(), None
    except urllib.error.HTTPError as err:
        return err.code, b"", err.headers.get("Location")


async def plant_certificate(
    db: asyncpg.Pool, deployment: Deployment, hostname: str, cert: x509.Certificate, cert_pem: bytes, key_pem: bytes
) -> None:
    """An ACTIVE row for hostname serving cert, its key encrypted with the
    deployment's key. Hold the reconcile schedule meanwhile (reconcile_schedule_paused)."""
    await db.execute(
        """INSERT INTO certificates (hostname, status, ssl_certificate, ssl_certificate_chain,
               encrypted_ssl_private_key, ssl_serial, ssl_expires_at, workflow_seen_at)
           VALUES ($1, 'ACTIVE', $2, '', $3, $4, now() + interval '30 days', now())""",
        hostname, cert_pem.decode(), deployment.encryption_key.encrypt(key_pem), format(cert.serial_number, "x"),
    )


def handshake(port: int, sni: str, root_pem: str | None = None) -> x509.Certificate:
    """The leaf the edge on ``port`` serves for sni; with root_pem the chain must
    verify to it for sni."""
    if root_pem is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cadata=root_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with context.wrap_socket(sock, server_hostname=sni) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


class HandshakeLoop:
    """Full handshakes with one SNI in a thread while the block runs, counting the
    failures and the serials seen."""

    def __init__(self, port: int, sni: str) -> None:
        self._port, self._sni = port, sni
        self.failures: list[str] = []
        self.serials: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                self.serials.append(handshake(self._port, self._sni).serial_number)
            except Exception as err:  # noqa: BLE001 - every failure is what is counted
                self.failures.append(f"{type(err).__name__}: {err}")

    def __enter__(self) -> HandshakeLoop:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join(10)
