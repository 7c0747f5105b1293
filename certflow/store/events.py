"""Pruning ``certificate_events`` past the retention (``EVENTS_RETENTION_DAYS``).

A pass walks the events from where the last one stopped (a watermark in
``event_retention``), in pages of the primary key: each page is an index range
read, so a pass costs the events it prunes, however many there are in all. An
event goes once it is older than the retention, unless it is its hostname's newest
(the product's last word on a hostname always stays, a deleted one's included);
the watermark only ever passes events that were old when it did. The change feed
(:mod:`certflow.store.changes`) follows transactions, not old ids, so pruning never
makes it skip or repeat anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg

PAGE = 5_000

_PRUNE_PAGE = """
WITH page AS (
    SELECT id, hostname, at FROM certificate_events
    WHERE id > $1 ORDER BY id LIMIT $2
), bound AS (
    -- Up to the first event not old yet (ids and times nearly agree; the rest of the
    -- page waits for a later pass).
    SELECT coalesce(min(id) FILTER (WHERE at >= now() - $3::interval) - 1, max(id)) AS through
    FROM page
), old AS (
    SELECT page.id, page.hostname FROM page, bound WHERE page.id <= bound.through
), gone AS (
    DELETE FROM certificate_events e USING old
    WHERE e.id = old.id
      AND EXISTS (SELECT 1 FROM certificate_events newer
                  WHERE newer.hostname = old.hostname AND newer.id > old.id)
    RETURNING e.id
)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM old) AS examined,
       (SELECT through FROM bound) AS through
"""


@dataclass(frozen=True)
class PruneResult:
    deleted: int
    examined: int
    """Events past the retention looked at (the deleted ones and hostnames' newest)."""
    through_id: int
    """Every event up to this id was looked at once it was old."""


async def prune_events(
    pool: asyncpg.Pool, retention: timedelta, max_pages: int = 20, page: int = PAGE
) -> PruneResult:
    """One pass: at most ``max_pages`` pages of events older than ``retention``."""
    deleted = examined = 0
    async with pool.acquire() as conn:
        through = int(await conn.fetchval(
            "INSERT INTO event_retention (singleton) VALUES (true) ON CONFLICT (singleton)"
            " DO UPDATE SET singleton = true RETURNING pruned_through"
        ))
        for _ in range(max_pages):
            async with conn.transaction():
                row = await conn.fetchrow(_PRUNE_PAGE, through, page, retention)
                assert row is not None
                if row["through"] is None or int(row["through"]) <= through:
                    break
                through = int(row["through"])
                deleted += int(row["deleted"])
                examined += int(row["examined"])
                await conn.execute("UPDATE event_retention SET pruned_through = $1", through)
    return PruneResult(deleted, examined, through)
