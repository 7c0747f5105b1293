"""Keeping an edge current: every certificate the TLS edge should hold, and only
those, pushed to an edge that is not this process (``certflow edge``).

:class:`EdgeFollower` converges from the rows once (keyset pages of what
:mod:`certflow.store.served` serves, the same queries
:class:`certflow.edge.serving.SniCertificates` uses, so both serve the same
rows), then follows ``certificate_events`` (:class:`certflow.store.changes.ChangeFeed`)
and re-reads only the hostnames that changed: O(certificates) once, then
O(changes). Each change is applied to an :class:`EdgeTarget`: HAProxy's memory
over its runtime API (:mod:`certflow.edge.haproxy`), a directory of files for
nginx (:mod:`certflow.edge.files`), or this process's memory that Caddy asks
(:mod:`certflow.edge.caddy`). An expiry writes no event: the follower keeps each
pushed certificate's expiry and removes it when it passes.

A row is checked before it is pushed: its chain must parse and the decrypted key
must match its leaf. One that does not is reported in one line (never the key)
and not pushed; what the edge held for that hostname stays. Keys are decrypted
in memory only, just before the push.

After a failed read (Postgres unreachable, a failover), or when the edge lost
what it held (HAProxy restarted), the follower cannot prove the edge missed
nothing, so it converges from the rows again once both answer; until then the
edge keeps what it holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

import asyncpg
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certflow.crypto import DecryptionError, EncryptionKey
from certflow.errors import CertflowError
from certflow.store import served
from certflow.store.changes import ChangeFeed
from certflow.store.served import StoredCertificate

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
PAGE = 5_000


class EdgeTarget(Protocol):
    """Where certificates are pushed: one edge kind (files for nginx, …)."""

    async def put(self, hostname: str, chain_pem: str, key_pem: bytes) -> None:
        """Hold ``chain_pem`` (leaf first) and ``key_pem`` for hostname, replacing
        what it held, all at once (the edge never sees half of it)."""

    async def remove(self, hostname: str) -> bool:
        """Hold nothing for hostname any more; whether it held something."""

    async def held(self) -> set[str]:
        """The hostnames the edge holds a certificate for now."""

    async def restarted(self) -> bool:
        """Whether the edge lost what was pushed since the last call (HAProxy
        restarted): the follower then pushes everything again."""

    async def start(self) -> None:
        """Take what the target needs (a lock, a listener); ConfigError when it cannot."""

    async def stop(self) -> None:
        """Let go of it (the edge keeps what it holds)."""


class EdgeUnreachableError(CertflowError, OSError):
    """The edge itself did not answer (its socket, its endpoint), as opposed to one
    push it refused: the pass stops there, and is tried again with backoff."""


class PushRefusedError(CertflowError, ValueError):
    """The edge refused one push or removal (retried by the next convergence)."""


class InvalidCertificateError(CertflowError, ValueError):
    """A stored certificate that must not be pushed (the message names no key material)."""


def checked_pair(stored: StoredCertificate, key: EncryptionKey) -> tuple[str, bytes]:
    """(chain PEM, key PEM) of a stored certificate, or InvalidCertificateError:
    the chain must parse, leaf first, and the decrypted key must be the leaf's."""
    chain_pem = stored.leaf_pem.rstrip("\n") + "\n"
    if stored.chain_pem.strip():
        chain_pem += stored.chain_pem.rstrip("\n") + "\n"
    try:
        certificates = x509.load_pem_x509_certificates(chain_pem.encode())
    except ValueError:
        raise InvalidCertificateError("its chain does not parse") from None
    try:
        key_pem = key.decrypt(stored.encrypted_key)
    except DecryptionError as err:
        raise InvalidCertificateError(str(err)) from None
    try:
        private_key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise InvalidCertificateError("its key does not parse") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private_key.public_key().public_bytes(*spki) != certificates[0].public_key().public_bytes(*spki):
        raise InvalidCertificateError("its key does not match its leaf")
    return chain_pem, key_pem


def _fingerprint(stored: StoredCertificate) -> bytes:
    digest = hashlib.sha256()
    for part in (stored.serial, stored.leaf_pem, stored.chain_pem):
        digest.update(part.encode() + b"\0")
    digest.update(stored.encrypted_key)
    return digest.digest()


@dataclass
class Convergence:
    """What one pass from the rows did."""

    served: int = 0
    pushed: int = 0
    removed: int = 0
    refused: int = 0
    failed: int = 0
    """Pushes or removals the target could not do (retried by the next convergence)."""


class EdgeFollower:
    """Keeps an :class:`EdgeTarget` holding exactly the certificates served now."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        key: EncryptionKey,
        target: EdgeTarget,
        *,
        poll_seconds: float = POLL_SECONDS,
        page: int = PAGE,
        source: str = "Postgres",
    ) -> None:
        self._pool = pool
        self._key = key
        self._target = target
        self.poll_seconds = poll_seconds
        self._page = page
        self._source = source
        self._feed = ChangeFeed()
        self._applied: dict[str, bytes] = {}
        """hostname → fingerprint of the row last pushed (or refused) for it."""
        self._expires: dict[str, datetime] = {}
        """hostname → when what was pushed for it expires (an expiry writes no event)."""
        self._expiries: list[tuple[datetime, str]] = []
        """A heap of (expiry, hostname); an entry whose hostname expires at another time
        since is stale, and skipped."""
        self.must_converge = True
        """Set at start and after anything that may have left the target behind the rows."""
        self._refused: set[str] = set()
        self.push_failures = 0
        """Pushes and removals the target could not do, since start."""
        self.converged_at: datetime | None = None
        self.synced_at: datetime | None = None
        """When the edge last held every change committed before it (a read of the
        feed, or a convergence, that left nothing behind)."""

    @property
    def held(self) -> int:
        """How many certificates the edge holds from this process."""
        return len(self._applied) - len(self._refused)

    # -- from the rows ------------------------------------------------------------------

    async def converge(self) -> Convergence:
        """Make the target hold exactly what the rows serve, and follow the change
        feed from here (a change during the pass is applied again after it)."""
        self._feed = ChangeFeed()
        self.must_converge = True
        await self._feed.start(self._pool)
        self._applied.clear()
        self._refused.clear()
        self._expires.clear()
        self._expiries.clear()
        self.must_converge = False
        result = Convergence()
        serving: set[str] = set()
        after = ""
        while True:
            page = await served.served_page(self._pool, after, self._page)
            for stored in page:
                serving.add(stored.hostname)
                await self._apply(stored, result)
            if len(page) < self._page:
                break
            after = page[-1].hostname
        try:
            held = await self._target.held()
        except EdgeUnreachableError:
            self.must_converge = True
            raise
        except OSError as err:
            self.must_converge = True
            log.error("edge: cannot list what the edge holds: %s", _reason(err))
            held = set()
            result.failed += 1
        for gone in sorted(held - serving):
            await self._remove(gone, result)
        result.served = len(serving)
        return result

    # -- then the changes ---------------------------------------------------------------

    async def follow_once(self) -> Convergence:
        """Apply what changed since the last read: each changed hostname's row read
        again, pushed when it is served, removed when it is not."""
        result = Convergence()
        changed = sorted({c.hostname for c in await self._feed.read(self._pool)})
        if not changed:
            return result
        found = {s.hostname: s for s in await served.served_certificates(self._pool, changed)}
        for hostname in changed:
            stored = found.get(hostname)
            before = (result.pushed, result.removed)
            if stored is not None:
                await self._apply(stored, result)
            else:  # deleted, expired, no certificate yet
                self._applied.pop(hostname, None)
                self._refused.discard(hostname)
                self._expires.pop(hostname, None)
                await self._remove(hostname, result)
            if result.pushed > before[0]:
                log.info("edge: pushed %s (serial %s)", hostname, stored.serial if stored else "")
            elif result.removed > before[1]:
                log.info("edge: removed %s", hostname)
        result.served = len(found)
        return result

    async def _apply(self, stored: StoredCertificate, result: Convergence) -> None:
        fingerprint = _fingerprint(stored)
        if self._applied.get(stored.hostname) == fingerprint:
            return
        self._applied[stored.hostname] = fingerprint
        if stored.expires_at is not None:
            self._expires[stored.hostname] = stored.expires_at
            heapq.heappush(self._expiries, (stored.expires_at, stored.hostname))
        try:
            chain_pem, key_pem = checked_pair(stored, self._key)
        except InvalidCertificateError as err:
            # What the edge held for it stays: the row is reported, never pushed.
            log.error("edge: not pushing %s (serial %s): %s", stored.hostname, stored.serial, err)
            self._refused.add(stored.hostname)
            result.refused += 1
            return
        try:
            await self._target.put(stored.hostname, chain_pem, key_pem)
        except EdgeUnreachableError:
            self._applied.pop(stored.hostname, None)
            raise
        except (OSError, ValueError) as err:
            self._applied.pop(stored.hostname, None)
            self.must_converge = True
            log.error("edge: cannot push %s: %s", stored.hostname, _reason(err))
            self.push_failures += 1
            result.failed += 1
            return
        self._refused.discard(stored.hostname)
        result.pushed += 1

    async def _remove(self, hostname: str, result: Convergence) -> None:
        try:
            if await self._target.remove(hostname):
                result.removed += 1
        except EdgeUnreachableError:
            raise
        except (OSError, ValueError) as err:
            self.must_converge = True
            log.error("edge: cannot remove %s: %s", hostname, _reason(err))
            self.push_failures += 1
            result.failed += 1

    async def expire(self, now: datetime | None = None) -> Convergence:
        """Remove what expired since it was pushed: an expiry writes no event, so the
        follower keeps each one's time (O(expired) per call)."""
        now = now or datetime.now(timezone.utc)
        result = Convergence()
        while self._expiries and self._expiries[0][0] <= now:
            when, hostname = heapq.heappop(self._expiries)
            if self._expires.get(hostname) != when:
                continue  # renewed (or removed) since
            del self._expires[hostname]
            self._applied.pop(hostname, None)
            self._refused.discard(hostname)
            await self._remove(hostname, result)
            log.info("edge: removed %s: its certificate expired at %s", hostname, when.isoformat())
        return result

    # -- forever ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, backoff: Sequence[float] = BACKOFF) -> None:
        """Converge, then follow until ``stop`` is set. Postgres or the edge not
        answering is one line each, retried with backoff; the edge keeps what it
        holds meanwhile, and the follower converges from the rows again once both
        answer. A target that failed a push, or that restarted, is converged again."""
        failures = 0
        away: str | None = None
        """What failed last time ("Postgres", "edge", "bug"), for one line each way."""
        while not stop.is_set():
            try:
                if await self._target.restarted():
                    log.warning("edge: the edge restarted and lost what it held; pushing everything again")
                    self.must_converge = True
                read_at = datetime.now(timezone.utc)
                if self.must_converge:
                    done = await self.converge()
                    log.info(
                        "edge: converged: %d served, %d pushed, %d removed, %d refused, %d failed",
                        done.served, done.pushed, done.removed, done.refused, done.failed,
                    )
                    if not self.must_converge:
                        self.converged_at = read_at
                else:
                    await self.follow_once()
                    await self.expire()
                if not self.must_converge:
                    self.synced_at = read_at
                if away in ("Postgres", "edge"):
                    log.info("edge: %s answers again", self._source if away == "Postgres" else "the edge")
                away = None
            except EdgeUnreachableError as err:
                self.must_converge = True
                if away != "edge":
                    log.warning("edge: %s; it keeps what it holds, retrying", err)
                away = "edge"
            except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
                self.must_converge = True  # a gap it cannot prove empty
                if away != "Postgres":
                    log.warning(
                        "edge: cannot read %s: %s; the edge keeps what it holds, retrying",
                        self._source, _reason(err),
                    )
                away = "Postgres"
            except Exception:  # noqa: BLE001 - a bug must not take down what the edge is served from
                self.must_converge = True
                log.exception("edge: unexpected error; converging again")
                away = "bug"
            failures = failures + 1 if away is not None or self.must_converge else 0
            wait = backoff[min(failures, len(backoff)) - 1] if failures else self.poll_seconds
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except asyncio.TimeoutError:
                pass


def _reason(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
