"""The event log on a real Postgres: followed in commit order, and kept to its
retention.

- The TLS edge (and the metrics) follow ``certificate_events`` by transaction
  (certflow/store/changes.py): an event of a transaction that commits after a later
  one was read is still handed out, so a renewal stored by a slow transaction
  is served at the next refresh.
- The retention pass (certflow/store/events.py) prunes 100,000 old events in
  pages, costs what it prunes, never takes a hostname's newest event, and leaves
  the feed, the edge and the metrics working.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import asyncpg
import pytest

from certflow.store.changes import ChangeFeed
from certflow.crypto import EncryptionKey
from certflow.store.db import create_pool, migrate
from certflow.store.events import prune_events
from certflow.metrics import CertflowMetrics
from certflow.edge.serving import SniCertificates

pytestmark = pytest.mark.e2e


@pytest.fixture
async def database(new_database: Callable[..., str]) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    url = new_database("certflow_events")
    pool = await create_pool(url, max_size=4)
    try:
        await migrate(pool)
        yield url, pool
    finally:
        await pool.close()


async def _served(pool: asyncpg.Pool, hostname: str, serial: str) -> None:
    """A row the edge serves (its PEMs and key are never parsed by refresh)."""
    await pool.execute(
        """INSERT INTO certificates (hostname, status, ssl_certificate, encrypted_ssl_private_key,
               ssl_serial, ssl_expires_at, workflow_seen_at)
           VALUES ($1, 'ACTIVE', 'leaf-' || $2, '\\x00'::bytea, $2, now() + interval '60 days', now())""",
        hostname,
        serial,
    )


async def test_a_renewal_committed_after_a_later_change_is_still_served(
    database: tuple[str, asyncpg.Pool],
) -> None:
    """Two overlapping transactions commit out of order: T1 stores a's renewal
    first (the lower event id) and stays open while T2 changes b and commits. The
    edge reads b's change, refreshes on for as long as T1 is open, then — one
    refresh after T1 commits — serves a's renewal. Red before this change (the feed
    followed ids, re-reading only the last 30 s): with T1 open longer than that
    look-back (shown with it set to 0), a's event was skipped for good and the edge
    served the old certificate until it expired."""
    url, pool = database
    await _served(pool, "a.events.test", "a1")
    await _served(pool, "b.events.test", "b1")
    edge = SniCertificates(pool, EncryptionKey(bytes(32)), refresh_seconds=0.1)
    await edge.refresh()
    assert edge.serial_for("a.events.test") == "a1"

    slow = await asyncpg.connect(url)
    try:
        t1 = slow.transaction()
        await t1.start()
        await slow.execute("UPDATE certificates SET ssl_serial = 'a2' WHERE hostname = 'a.events.test'")
        await pool.execute("UPDATE certificates SET ssl_serial = 'b2' WHERE hostname = 'b.events.test'")
        ids = await slow.fetch(
            "SELECT id, hostname::text AS h FROM certificate_events WHERE to_status = 'ACTIVE'"
            " AND from_status = 'ACTIVE' ORDER BY id"
        )
        assert [r["h"] for r in ids] == ["a.events.test", "b.events.test"]  # a's id is lower
        assert await edge.refresh() == 1
        assert edge.serial_for("b.events.test") == "b2"
        for _ in range(5):  # however long T1 stays open
            await edge.refresh()
            assert edge.serial_for("a.events.test") == "a1"
        await t1.commit()
    finally:
        await slow.close()
    assert await edge.refresh() == 1
    assert edge.serial_for("a.events.test") == "a2"
    assert await edge.refresh() == 0  # handed out once


async def test_the_feed_hands_each_event_out_once(database: tuple[str, asyncpg.Pool]) -> None:
    """Events of transactions still open when the feed started, or read again while
    an older transaction holds the horizon back, come out exactly once."""
    url, pool = database
    await _served(pool, "c.events.test", "c1")
    holder = await asyncpg.connect(url)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.execute("UPDATE certificates SET ssl_serial = 'c2' WHERE hostname = 'c.events.test'")
        feed = ChangeFeed()
        await feed.start(pool)
        for n in range(3):
            await _served(pool, f"d{n}.events.test", "d")
        first = await feed.read(pool)
        again = await feed.read(pool)
        await hold.commit()
    finally:
        await holder.close()
    late = await feed.read(pool)
    assert sorted(c.hostname for c in first) == [f"d{n}.events.test" for n in range(3)]
    assert again == []
    assert [c.hostname for c in late] == ["c.events.test"]
    assert await feed.read(pool) == []


async def test_retention_prunes_old_events_in_pages_and_keeps_each_newest(
    database: tuple[str, asyncpg.Pool],
) -> None:
    """100,000 events older than the retention over 1,000 hostnames, and recent ones:
    one pass of pages deletes the old ones but each hostname's newest, a second pass
    examines nothing (it starts where the first stopped), and the edge and the
    metrics follow a change made after the prune. Red with the newest-event guard
    taken out of the delete: 100,000 deleted."""
    _, pool = database
    await pool.execute(
        """INSERT INTO certificate_events (certificate_id, hostname, at, from_status, to_status)
           SELECT gen_random_uuid(), 'h' || (i % 1000) || '.old.test',
                  now() - interval '500 days' + make_interval(secs => i), 'PENDING', 'PENDING'
           FROM generate_series(1, 100000) AS i"""
    )
    await _served(pool, "fresh.events.test", "f1")  # a recent event
    edge = SniCertificates(pool, EncryptionKey(bytes(32)))
    metrics = CertflowMetrics()
    await edge.refresh()
    await metrics.refresh_from_database(pool)

    result = await prune_events(pool, timedelta(days=400), max_pages=100)
    print(f"\n[retention] deleted {result.deleted}, examined {result.examined}, through id {result.through_id}")
    assert result.deleted == 99_000  # all but the newest of each of the 1,000 hostnames
    assert result.examined == 100_000
    left = await pool.fetchval("SELECT count(*) FROM certificate_events WHERE hostname LIKE '%.old.test'")
    assert left == 1000
    newest = await pool.fetchval(
        """SELECT count(*) FROM certificate_events e WHERE hostname LIKE '%.old.test'
           AND id = (SELECT max(id) FROM certificate_events n WHERE n.hostname = e.hostname)"""
    )
    assert newest == 1000
    assert await pool.fetchval("SELECT count(*) FROM certificate_events WHERE hostname = 'fresh.events.test'") == 1

    again = await prune_events(pool, timedelta(days=400), max_pages=100)
    assert (again.deleted, again.examined) == (0, 0)

    await pool.execute("UPDATE certificates SET ssl_serial = 'f2' WHERE hostname = 'fresh.events.test'")
    assert await edge.refresh() == 1
    assert edge.serial_for("fresh.events.test") == "f2"
    await metrics.refresh_from_database(pool)  # follows the events since: no recount, no error
