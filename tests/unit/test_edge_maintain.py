"""The follower's decisions (certflow/edge/maintain.py), on fakes of the two
queries it shares with SniCertificates and of the change feed: what is pushed,
what is refused (and reported in one line that holds no key), what is removed,
and what the edge keeps while Postgres is away."""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from collections.abc import Sequence
from typing import Any

import pytest

from certflow.crypto import EncryptionKey
from certflow.edge import maintain
from certflow.edge.maintain import EdgeFollower, EdgeUnreachableError, InvalidCertificateError, checked_pair
from certflow.store.changes import Change
from certflow.store import served as served_queries
from certflow.store.served import StoredCertificate
from tests.unit.edge_pki import leaf

KEY = EncryptionKey(secrets.token_bytes(32))


def stored(hostname: str, serial: str = "01", *, key: EncryptionKey = KEY) -> StoredCertificate:
    cert, key_pem = leaf(hostname)
    return StoredCertificate(hostname, serial, cert, "", key.encrypt(key_pem))


class MemoryTarget:
    """An edge in memory; ``down`` makes it unreachable, ``restart()`` forgets all."""

    def __init__(self, held: dict[str, tuple[str, bytes]] | None = None) -> None:
        self.files: dict[str, tuple[str, bytes]] = dict(held or {})
        self.puts: list[str] = []
        self.down = False
        self._restarted = False

    def restart(self) -> None:
        self.files.clear()
        self._restarted = True

    async def put(self, hostname: str, chain_pem: str, key_pem: bytes) -> None:
        if self.down:
            raise EdgeUnreachableError("cannot reach the test edge: ConnectionRefusedError")
        self.files[hostname] = (chain_pem, key_pem)
        self.puts.append(hostname)

    async def remove(self, hostname: str) -> bool:
        return self.files.pop(hostname, None) is not None

    async def held(self) -> set[str]:
        return set(self.files)

    async def start(self) -> None:
        pass

    async def restarted(self) -> bool:
        restarted, self._restarted = self._restarted, False
        return restarted

    async def stop(self) -> None:
        pass


class Rows:
    """The rows as the two queries of certflow/store/served.py would read them, and
    a change feed over them; ``down`` makes every read fail as an unreachable
    Postgres does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows: dict[str, StoredCertificate] = {}
        self.changes: list[str] = []
        self.down = False
        rows = self

        async def served_page(_pool: Any, after: str, limit: int) -> list[StoredCertificate]:
            rows._check()
            return [rows.rows[h] for h in sorted(rows.rows) if h > after][:limit]

        async def served_certificates(_pool: Any, hostnames: Sequence[str]) -> list[StoredCertificate]:
            rows._check()
            return [rows.rows[h] for h in hostnames if h in rows.rows]

        class Feed:
            async def start(self, _pool: Any) -> None:
                rows._check()
                rows.changes.clear()

            async def read(self, _pool: Any) -> list[Change]:
                rows._check()
                changed, rows.changes[:] = list(rows.changes), []
                return [Change(i, h, None, "ACTIVE") for i, h in enumerate(changed)]

        monkeypatch.setattr(served_queries, "served_page", served_page)
        monkeypatch.setattr(served_queries, "served_certificates", served_certificates)
        monkeypatch.setattr(maintain, "ChangeFeed", Feed)

    def _check(self) -> None:
        if self.down:
            raise ConnectionRefusedError(111, "Connection refused")

    def set(self, row: StoredCertificate) -> None:
        self.rows[row.hostname] = row
        self.changes.append(row.hostname)

    def drop(self, hostname: str) -> None:
        del self.rows[hostname]
        self.changes.append(hostname)


def test_a_row_is_pushed_only_when_its_chain_parses_and_its_key_is_its_leafs() -> None:
    """Red if any of the three were pushed: a chain that does not parse, a key of
    another certificate, a key that does not decrypt with the configured key."""
    good = stored("good.example.com")
    chain, key_pem = checked_pair(good, KEY)
    assert chain.startswith("-----BEGIN CERTIFICATE-----") and b"PRIVATE KEY" in key_pem
    other = stored("other.example.com")
    for bad, reason in (
        (StoredCertificate("a.example.com", "02", "not a PEM", "", good.encrypted_key), "chain does not parse"),
        (StoredCertificate("a.example.com", "03", good.leaf_pem, "", other.encrypted_key), "does not match its leaf"),
        (stored("a.example.com", key=EncryptionKey(secrets.token_bytes(32))), "does not decrypt"),
    ):
        with pytest.raises(InvalidCertificateError, match=reason):
            checked_pair(bad, KEY)


async def test_converging_pushes_what_is_served_removes_the_rest_and_refuses_bad_rows(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """From the rows, once: every served row pushed, a file for a hostname no longer
    served removed, a mismatched key reported in one line (hostname, serial, why;
    never key material) and not pushed, what the edge held for it kept. Red if the
    mismatch check is skipped (the bad pair pushed: nginx then fails every
    handshake of that name) or the removal of what is not served is."""
    rows = Rows(monkeypatch)
    a, b = stored("a.example.com"), stored("b.example.com")
    rows.set(a)
    rows.set(b)
    bad_b = StoredCertificate("b.example.com", "99", b.leaf_pem, "", stored("x.example.com").encrypted_key)
    rows.set(bad_b)
    target = MemoryTarget({"b.example.com": ("OLD-B", b"OLD-KEY"), "gone.example.com": ("G", b"G")})
    follower = EdgeFollower(None, KEY, target, page=1)
    with caplog.at_level(logging.INFO, logger="certflow.edge.maintain"):
        done = await follower.converge()
    assert (done.served, done.pushed, done.removed, done.refused) == (2, 1, 1, 1)
    assert set(target.files) == {"a.example.com", "b.example.com"}
    assert target.files["b.example.com"] == ("OLD-B", b"OLD-KEY")
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert refused == ["edge: not pushing b.example.com (serial 99): its key does not match its leaf"]
    assert "PRIVATE KEY" not in caplog.text


async def test_following_pushes_a_renewal_and_removes_a_deleted_hostname(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Then only what changed: a renewal pushed, a row that is not served any more
    removed, an event that changed nothing of the certificate (RENEWING) pushes
    nothing. Red if a delete is ignored (the edge serves a deleted hostname's
    certificate until it expires)."""
    rows = Rows(monkeypatch)
    rows.set(stored("a.example.com", "01"))
    rows.set(stored("b.example.com", "01"))
    target = MemoryTarget()
    follower = EdgeFollower(None, KEY, target)
    await follower.converge()
    assert target.puts == ["a.example.com", "b.example.com"]
    renewed = stored("a.example.com", "02")
    rows.set(renewed)
    rows.drop("b.example.com")
    rows.changes.append("a.example.com")  # a second event for the same row
    done = await follower.follow_once()
    assert (done.pushed, done.removed) == (1, 1)
    assert target.files["a.example.com"][0].startswith(renewed.leaf_pem.rstrip("\n"))
    assert set(target.files) == {"a.example.com"}
    rows.changes.append("a.example.com")  # a status change, the same certificate
    assert (await follower.follow_once()).pushed == 0


async def test_postgres_away_the_edge_keeps_what_it_holds_then_converges_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An unreachable Postgres: one line naming it, retries with backoff, nothing
    removed; once it answers, a convergence from the rows (a delete made while it
    was away is applied). Red if a failed read dropped what the edge holds, or the
    follower went on from the feed without converging (``must_converge`` not set)."""
    rows = Rows(monkeypatch)
    rows.set(stored("a.example.com"))
    rows.set(stored("b.example.com"))
    target = MemoryTarget()
    follower = EdgeFollower(None, KEY, target, poll_seconds=0.01, source="Postgres at pg.test")
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="certflow.edge.maintain"):
        running = asyncio.create_task(follower.run(stop, backoff=(0.01, 0.02)))
        while set(target.files) != {"a.example.com", "b.example.com"}:
            await asyncio.sleep(0.01)
        rows.down = True
        await asyncio.sleep(0.2)
        assert set(target.files) == {"a.example.com", "b.example.com"}
        del rows.rows["b.example.com"]  # deleted while away; its event is not seen
        rows.down = False
        while "b.example.com" in target.files:
            await asyncio.sleep(0.01)
        stop.set()
        await running
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("edge: cannot read Postgres at pg.test:")
    assert any("answers again" in r.getMessage() for r in caplog.records)


async def test_an_edge_away_or_restarted_is_one_line_then_everything_pushed_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The edge unreachable during a renewal: one warning naming it (not one
    error per certificate), retried with backoff; once it answers, a convergence
    pushes what it missed. The edge restarted (HAProxy forgets what was pushed):
    one line, and everything pushed again. Red if an unreachable edge were a
    per-certificate failure (200 lines for 200 names), or if ``restarted()`` were
    not asked (shown: the restarted edge stayed empty)."""
    rows = Rows(monkeypatch)
    for i in range(200):
        rows.set(stored(f"h{i}.example.com"))
    target = MemoryTarget()
    follower = EdgeFollower(None, KEY, target, poll_seconds=0.01)
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="certflow.edge.maintain"):
        running = asyncio.create_task(follower.run(stop, backoff=(0.01, 0.02)))
        while len(target.files) < 200:
            await asyncio.sleep(0.01)
        target.down = True  # goes away after the restart check: the pushes fail
        for i in range(200):
            rows.set(stored(f"h{i}.example.com", "02"))
        await asyncio.sleep(0.2)
        target.down = False
        renewed = rows.rows["h199.example.com"].leaf_pem.rstrip("\n")
        while not target.files["h199.example.com"][0].startswith(renewed):
            await asyncio.sleep(0.01)
        target.restart()
        while len(target.files) < 200:
            await asyncio.sleep(0.01)
        stop.set()
        await running
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert messages == [
        "edge: cannot reach the test edge: ConnectionRefusedError; it keeps what it holds, retrying",
        "edge: the edge restarted and lost what it held; pushing everything again",
    ], messages


async def test_an_expired_certificate_is_removed_without_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """An expiry writes no event: the follower keeps each pushed certificate's expiry
    and removes it when it passes; a renewal pushed before then keeps it. Red
    without ``expire`` (the edge would serve an expired certificate, which every
    client refuses, instead of its default one)."""
    now = datetime.now(timezone.utc)
    rows = Rows(monkeypatch)
    rows.set(replace(stored("a.example.com"), expires_at=now + timedelta(hours=1)))
    rows.set(replace(stored("b.example.com"), expires_at=now + timedelta(hours=1)))
    target = MemoryTarget()
    follower = EdgeFollower(None, KEY, target)
    await follower.converge()
    rows.set(replace(stored("b.example.com", "02"), expires_at=now + timedelta(days=60)))
    await follower.follow_once()
    assert (await follower.expire(now + timedelta(minutes=59))).removed == 0
    assert (await follower.expire(now + timedelta(hours=2))).removed == 1
    assert set(target.files) == {"b.example.com"}
