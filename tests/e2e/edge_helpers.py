"""What the edge tests (test_edge_files.py, test_edge_caddy.py) share beyond
test_edge_files' own helpers: a plain HTTP request to an edge's port 80, and a
certificate row planted directly (the edge follows rows, however they were issued)."""

from __future__ import annotations

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
