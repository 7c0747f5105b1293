"""What changed since last time, read from ``certificate_events``.

Every transition of a certificate writes an event in the same transaction (a
trigger), with an increasing id: reading the events past the last one seen is
an index range scan that costs the changes, not the rows. The TLS edge helper
and the metrics refresh follow certificates this way.

Ids are taken when an event is written and seen when its transaction commits,
so a transaction that commits after a later one shows a lower id late: the feed
re-reads the events of the last LOOK_BACK_SECONDS and hands each out once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import asyncpg

LOOK_BACK_SECONDS = 30.0


@dataclass(frozen=True)
class Change:
    id: int
    hostname: str
    from_status: str | None
    to_status: str


class ChangeFeed:
    """The certificate events past a starting point, each handed out once."""

    def __init__(self, look_back_seconds: float = LOOK_BACK_SECONDS) -> None:
        self._look_back = look_back_seconds
        self._horizon: int | None = None  # every event up to this id was handed out
        self._recent: dict[int, float] = {}  # ids above the horizon handed out, and when

    async def start(self, conn: asyncpg.Pool | asyncpg.Connection) -> None:
        """Begin after the newest event: call before reading the state the events change."""
        self._horizon = int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM certificate_events"))
        self._recent.clear()

    @property
    def started(self) -> bool:
        return self._horizon is not None

    async def read(self, pool: asyncpg.Pool) -> list[Change]:
        """The events not handed out yet, oldest first."""
        assert self._horizon is not None, "start() the feed first"
        rows = await pool.fetch(
            "SELECT id, hostname::text AS hostname, from_status, to_status"
            " FROM certificate_events WHERE id > $1 ORDER BY id",
            self._horizon,
        )
        now = time.monotonic()
        fresh = [Change(**dict(r)) for r in rows if r["id"] not in self._recent]
        for change in fresh:
            self._recent[change.id] = now
        self._advance(now)
        return fresh

    def _advance(self, now: float) -> None:
        """Past the events handed out longer than the look-back ago, up to the first id
        not seen yet (a gap may still be filled by a late commit)."""
        assert self._horizon is not None
        for event_id in sorted(self._recent):
            if now - self._recent[event_id] <= self._look_back:
                break
            self._horizon = event_id
            del self._recent[event_id]
