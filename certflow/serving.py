"""Serving certificates at the TLS edge.

:func:`load_certificate` returns a hostname's chain and private key, the key
decrypted in memory only. :class:`SniCertificates` is a server-name callback
for Python's :mod:`ssl` that serves each hostname's current certificate and
picks up a renewed one without a restart: it checks Postgres for changed rows
every ``refresh_seconds`` (5 s by default), so a replaced certificate is served
at most that long after it was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from certflow.crypto import EncryptionKey

log = logging.getLogger(__name__)

REFRESH_SECONDS = 5.0
_LOOK_BACK = timedelta(seconds=30)
_SERVED = ("ACTIVE", "RENEWING", "EXPIRED", "FAILED")


class CertificateNotFoundError(LookupError):
    """No current certificate for that hostname."""


@dataclass(frozen=True)
class ServedCertificate:
    hostname: str
    chain_pem: str  # leaf first, then intermediates
    key_pem: bytes
    serial: str
    updated_at: datetime


async def load_certificate(
    pool: asyncpg.Pool, hostname: str, key: EncryptionKey
) -> tuple[str, bytes]:
    """(chain PEM, key PEM) of hostname's current certificate; the key exists only in memory."""
    served = await _load(pool, key, hostname)
    if not served:
        raise CertificateNotFoundError(f"no current certificate for {hostname}")
    return served[0].chain_pem, served[0].key_pem


async def _load(
    pool: asyncpg.Pool, key: EncryptionKey, hostname: str | None = None, since: datetime | None = None
) -> list[ServedCertificate]:
    rows = await pool.fetch(
        """
        SELECT hostname::text AS hostname, ssl_certificate, ssl_certificate_chain,
               encrypted_ssl_private_key, ssl_serial, updated_at
        FROM certificates
        WHERE ssl_certificate IS NOT NULL AND status = ANY($1::text[])
          AND ($2::text IS NULL OR hostname = $2)
          AND ($3::timestamptz IS NULL OR updated_at > $3)
        """,
        list(_SERVED),
        hostname,
        since,
    )
    return [
        ServedCertificate(
            hostname=r["hostname"],
            chain_pem=r["ssl_certificate"] + (r["ssl_certificate_chain"] or ""),
            key_pem=key.decrypt(bytes(r["encrypted_ssl_private_key"])),
            serial=r["ssl_serial"],
            updated_at=r["updated_at"],
        )
        for r in rows
    ]


async def _served_hostnames(pool: asyncpg.Pool) -> set[str]:
    rows = await pool.fetch(
        "SELECT hostname::text AS hostname FROM certificates"
        " WHERE ssl_certificate IS NOT NULL AND status = ANY($1::text[])",
        list(_SERVED),
    )
    return {r["hostname"] for r in rows}


@contextlib.contextmanager
def _in_memory_file(name: str, data: bytes) -> Iterator[str]:
    """A path to data that never touches a disk (Linux memfd), for ssl's file-only loaders."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _server_context(served: ServedCertificate) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with _in_memory_file("chain", served.chain_pem.encode()) as chain, _in_memory_file(
        "key", served.key_pem
    ) as key_path:
        context.load_cert_chain(chain, key_path)
    return context


class SniCertificates:
    """Per-hostname TLS contexts for an ``ssl`` server, kept current from Postgres.

    Set ``context.sni_callback = certs.sni_callback`` on the server's default
    context and run :meth:`run` (or call :meth:`refresh`) on the event loop.
    """

    def __init__(
        self, pool: asyncpg.Pool, key: EncryptionKey, refresh_seconds: float = REFRESH_SECONDS
    ) -> None:
        self._pool = pool
        self._key = key
        self.refresh_seconds = refresh_seconds
        self._contexts: dict[str, tuple[str, ssl.SSLContext]] = {}
        self._seen: datetime | None = None

    async def refresh(self) -> int:
        """Load every certificate changed since the last refresh and forget the ones no
        longer served (canceled, deleted); returns how many were (re)loaded."""
        # Rows whose transactions commit out of order can carry a slightly older
        # updated_at: look back a little and reload those few twice.
        since = self._seen - _LOOK_BACK if self._seen is not None else None
        changed = await _load(self._pool, self._key, since=since)
        for served in changed:
            current = self._contexts.get(served.hostname)
            if current is None or current[0] != served.serial:
                self._contexts[served.hostname] = (served.serial, _server_context(served))
            if self._seen is None or served.updated_at > self._seen:
                self._seen = served.updated_at
        for gone in set(self._contexts) - await _served_hostnames(self._pool):
            del self._contexts[gone]
        return len(changed)

    async def run(self) -> None:
        """Refresh forever (cancel the task to stop)."""
        while True:
            try:
                await self.refresh()
            except (OSError, asyncpg.PostgresError) as err:
                log.warning("certificate refresh failed: %s", err)
            await asyncio.sleep(self.refresh_seconds)

    def serial_for(self, hostname: str) -> str | None:
        entry = self._contexts.get(hostname.lower().rstrip("."))
        return entry[0] if entry else None

    def sni_callback(
        self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        """Switch the handshake to the certificate of the requested server name."""
        if server_name is None:
            return
        entry = self._contexts.get(server_name.lower().rstrip("."))
        if entry is not None:
            ssl_object.context = entry[1]
