"""What changed since last time, read from ``certificate_events`` in commit order.

Every transition of a certificate writes an event in the same transaction (a
trigger), tagged with that transaction's id (``xid``, a 64-bit ``xid8``). Ids of
events are taken at insert but seen at commit, so a long transaction that commits
after a later one would be skipped by a reader that only follows the highest id.
The feed follows transactions instead: every transaction older than the oldest
one still running at a read (``pg_snapshot_xmin``) has committed or aborted, and
all its events were visible to that read; so the next read asks only for events
of transactions from that point on, and hands each event out once.

The reads are index range scans over the recent transactions' events
(``certificate_events_xid``): their cost follows the changes, not the rows. A
write transaction that stays open holds the point back (its events may still
come), and the events since are read again each time, cheaply, until it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg

_HORIZON = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
_SINCE = """
    SELECT id, hostname::text AS hostname, from_status, to_status, xid::text::bigint AS xid
    FROM certificate_events WHERE xid >= $1::bigint::text::xid8 ORDER BY id
"""


@dataclass(frozen=True)
class Change:
    id: int
    hostname: str
    from_status: str | None
    to_status: str


class ChangeFeed:
    """The certificate events of transactions that committed since a starting
    point, each handed out once."""

    def __init__(self) -> None:
        self._horizon: int | None = None
        """Every transaction below it was over when last read."""
        self._handed_out: dict[int, int] = {}
        """Events of transactions at or above the horizon already handed out: id → xid."""

    async def start(self, conn: asyncpg.Pool | asyncpg.Connection) -> None:
        """Begin after what ``conn`` sees now. Call it in the snapshot (a repeatable
        read transaction) that reads the state the events change, or before reading
        it: events already in that state are not handed out again, or handed out
        once more (harmless for a reader that reloads)."""
        async with _snapshot(conn) as tx:
            self._horizon = int(await tx.fetchval(_HORIZON))
            self._handed_out = {r["id"]: r["xid"] for r in await tx.fetch(_SINCE, self._horizon)}

    @property
    def started(self) -> bool:
        return self._horizon is not None

    async def read(self, pool: asyncpg.Pool | asyncpg.Connection) -> list[Change]:
        """The events committed since the last read and not handed out yet, by id."""
        assert self._horizon is not None, "start() the feed first"
        async with _snapshot(pool) as tx:
            horizon = int(await tx.fetchval(_HORIZON))
            rows = await tx.fetch(_SINCE, self._horizon)
        fresh = [
            Change(r["id"], r["hostname"], r["from_status"], r["to_status"])
            for r in rows
            if r["id"] not in self._handed_out
        ]
        for row in rows:
            self._handed_out[row["id"]] = row["xid"]
        self._horizon = horizon
        self._handed_out = {i: x for i, x in self._handed_out.items() if x >= horizon}
        return fresh


@contextlib.asynccontextmanager
async def _snapshot(source: Any) -> AsyncIterator[Any]:
    """One repeatable-read snapshot for both reads — the horizon and the events must
    be read as of the same moment — on a connection (used as it is when already in a
    transaction) or one taken from a pool."""
    if isinstance(source, asyncpg.Connection):
        if source.is_in_transaction():
            yield source
            return
        async with source.transaction(isolation="repeatable_read", readonly=True):
            yield source
        return
    async with source.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        yield conn
