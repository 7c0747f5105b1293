"""The retention activity: prune ``certificate_events`` past ``EVENTS_RETENTION_DAYS``,
run by the reconcile schedule after each pass."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
from temporalio import activity

from certflow.store.events import prune_events
from certflow.activity_payloads import PruneEventsResult


class RetentionActivities:
    """Keeps the event log to its retention (0 days: keep everything)."""

    def __init__(self, pool: asyncpg.Pool, retention_days: float) -> None:
        self._pool = pool
        self._retention = timedelta(days=retention_days) if retention_days > 0 else None

    @activity.defn(name="prune_events")
    async def prune_events(self) -> PruneEventsResult:
        """Delete events older than the retention, never a hostname's newest."""
        if self._retention is None:
            return PruneEventsResult(deleted=0, examined=0)
        result = await prune_events(self._pool, self._retention)
        if result.deleted:
            activity.logger.info(
                "pruned %d events older than the retention (up to id %d)",
                result.deleted,
                result.through_id,
            )
        return PruneEventsResult(deleted=result.deleted, examined=result.examined)
