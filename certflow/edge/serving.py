"""Serving certificates at the TLS edge.

:func:`load_certificate` returns a hostname's chain and private key, the key
decrypted in memory only. :class:`SniCertificates` is a server-name callback
for Python's :mod:`ssl` that serves each hostname's current certificate and
picks up a renewed one without a restart.

Built for many hostnames: what is served is kept in memory as stored (leaf,
shared chain, *encrypted* key), loaded once at start and then refreshed from
``certificate_events`` (its primary key is the change marker: a refresh with no
change reads a few index entries, however many rows there are). A TLS context
is built only on a hostname's first handshake — the key decrypted then — and
kept in a bounded LRU; a renewed certificate replaces it at most
``refresh_seconds`` after it was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import ssl
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import asyncpg

from certflow.store import served
from certflow.store.changes import ChangeFeed
from certflow.store.served import StoredCertificate
from certflow.crypto import EncryptionKey
from certflow.errors import CertflowError

log = logging.getLogger(__name__)

REFRESH_SECONDS = 5.0
CONTEXT_CACHE_SIZE = 10_000
_PAGE = 5_000


class CertificateNotFoundError(CertflowError, LookupError):
    """No current certificate for that hostname."""


async def load_certificate(
    pool: asyncpg.Pool, hostname: str, key: EncryptionKey
) -> tuple[str, bytes]:
    """(chain PEM, key PEM) of hostname's current certificate; the key exists only in memory."""
    stored = await served.served_certificate(pool, hostname)
    if stored is None:
        raise CertificateNotFoundError(f"no current certificate for {hostname}")
    return stored.leaf_pem + stored.chain_pem, key.decrypt(stored.encrypted_key)


@contextlib.contextmanager
def _in_memory_file(name: str, data: bytes) -> Iterator[str]:
    """A path to data that never touches a disk (Linux memfd), for ssl's file-only loaders."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _server_context(chain_pem: str, key_pem: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with _in_memory_file("chain", chain_pem.encode()) as chain, _in_memory_file(
        "key", key_pem
    ) as key_path:
        context.load_cert_chain(chain, key_path)
    return context


class SniCertificates:
    """Per-hostname TLS contexts for an ``ssl`` server, kept current from Postgres.

    Set ``context.sni_callback = certs.sni_callback`` on the server's default
    context and run :meth:`run` (or call :meth:`refresh`) on the event loop.
    At most ``cache_size`` contexts are kept; the least recently used is
    dropped and rebuilt from memory on its hostname's next handshake.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        key: EncryptionKey,
        refresh_seconds: float = REFRESH_SECONDS,
        cache_size: int = CONTEXT_CACHE_SIZE,
    ) -> None:
        if cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        self._pool = pool
        self._key = key
        self.refresh_seconds = refresh_seconds
        self.cache_size = cache_size
        self._stored: dict[str, StoredCertificate] = {}
        self._chains: dict[str, str] = {}  # one copy of each intermediate chain
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._changes = ChangeFeed()

    # -- keeping up with Postgres ---------------------------------------------------

    async def refresh(self) -> int:
        """Apply what changed since the last refresh (everything, the first time);
        returns how many hostnames were (re)loaded or dropped."""
        if not self._changes.started:
            return await self._load_all()
        changed = sorted({c.hostname for c in await self._changes.read(self._pool)})
        if changed:
            await self._reload(changed)
        return len(changed)

    async def _load_all(self) -> int:
        # The events' position first: a change during the load is applied again after it.
        await self._changes.start(self._pool)
        after = ""
        while True:
            # Keyset pages in the order of the hostname's unique index.
            page = await served.served_page(self._pool, after, _PAGE)
            for stored in page:
                self._store(stored)
            if len(page) < _PAGE:
                break
            after = page[-1].hostname
        return len(self._stored)

    async def _reload(self, hostnames: Sequence[str]) -> None:
        found_now = await served.served_certificates(self._pool, hostnames)
        found = {stored.hostname for stored in found_now}
        for stored in found_now:
            self._store(stored)
        for gone in set(hostnames) - found:  # canceled, deleted, no certificate yet
            self._stored.pop(gone, None)
            self._contexts.pop(gone, None)

    def _store(self, stored: StoredCertificate) -> None:
        hostname = stored.hostname
        # One copy of each intermediate chain, however many hostnames share it.
        chain = self._chains.setdefault(stored.chain_pem, stored.chain_pem)
        stored = dataclasses.replace(stored, chain_pem=chain)
        if self._stored.get(hostname) != stored:
            self._stored[hostname] = stored
            self._contexts.pop(hostname, None)  # rebuilt on the next handshake

    async def run(self) -> None:
        """Refresh forever (cancel the task to stop)."""
        while True:
            try:
                await self.refresh()
            except (OSError, asyncpg.PostgresError) as err:
                log.warning("certificate refresh failed: %s", err)
            await asyncio.sleep(self.refresh_seconds)

    # -- serving ------------------------------------------------------------------------

    def serial_for(self, hostname: str) -> str | None:
        served = self._served_name(hostname)
        return self._stored[served].serial if served else None

    def _served_name(self, hostname: str) -> str | None:
        """Whose certificate a name is served: its own, else a wildcard's one label
        up (``a.shop.example.com`` by ``*.shop.example.com``, never ``a.b.shop...``)."""
        name = hostname.lower().rstrip(".")
        if name in self._stored:
            return name
        _, dot, parent = name.partition(".")
        wildcard = f"*.{parent}"
        return wildcard if dot and parent and wildcard in self._stored else None

    @property
    def cached_contexts(self) -> int:
        return len(self._contexts)

    def context_for(self, hostname: str) -> ssl.SSLContext | None:
        """The TLS context of hostname's current certificate, or of a wildcard's that
        covers it (an exact hostname wins); built now if not cached."""
        name = self._served_name(hostname)
        if name is None:
            return None
        context = self._contexts.get(name)
        if context is not None:
            self._contexts.move_to_end(name)
            return context
        stored = self._stored[name]
        context = _server_context(stored.leaf_pem + stored.chain_pem, self._key.decrypt(stored.encrypted_key))
        self._contexts[name] = context
        if len(self._contexts) > self.cache_size:
            self._contexts.popitem(last=False)
        return context

    def sni_callback(
        self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        """Switch the handshake to the certificate of the requested server name."""
        if server_name is None:
            return
        context = self.context_for(server_name)
        if context is not None:
            ssl_object.context = context
