"""The retention activity: prune ``certificate_events`` past ``EVENTS_RETENTION_DAYS``,
run by the reconcile passes that start in the first hour of the UTC day
(workflows/reconcile.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import asyncpg
from temporalio import activity

from certflow.store.events import PAGE, prune_events
from certflow.activity_payloads import PruneEventsResult

PAGES_PER_CALL = 20
"""Pages of the store's prune per call (100,000 events): a day's worth at any
size certflow runs at."""
BUDGET_SECONDS = 120.0
"""How long one prune goes on calling while each call finds a full load (its
start-to-close timeout is 5 minutes): a backlog is pruned over the days after."""


class RetentionActivities:
    """Keeps the event log to its retention (0 days: keep everything)."""

    def __init__(
        self, pool: asyncpg.Pool, retention_days: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._pool = pool
        self._retention = timedelta(days=retention_days) if retention_days > 0 else None
        self._clock = clock

    @activity.defn(name="prune_events")
    async def prune_events(self) -> PruneEventsResult:
        """Delete events older than the retention, never a hostname's newest: the
        store's passes one after another while each finds a full load, within
        BUDGET_SECONDS."""
        if self._retention is None:
            return PruneEventsResult(deleted=0, examined=0)
        deleted = examined = 0
        began = self._clock()
        while True:
            result = await prune_events(self._pool, self._retention, max_pages=PAGES_PER_CALL)
            deleted += result.deleted
            examined += result.examined
            # A call that came back short found the end of what is old.
            if result.examined < PAGES_PER_CALL * PAGE or self._clock() - began >= BUDGET_SECONDS:
                break
        if deleted:
            activity.logger.info(
                "pruned %d events older than the retention (up to id %d)", deleted, result.through_id
            )
        return PruneEventsResult(deleted=deleted, examined=examined)
