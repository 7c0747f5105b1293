"""What ``certflow edge`` says about itself: its row in ``edges`` (for ``status
HOST``) and, when ``CERTFLOW_EDGE_METRICS_LISTEN`` is set, Prometheus metrics
(the alert rules' "edge lagging" and "edge push failing" read them).

Written every few seconds from the follower's own figures: one upsert per edge,
never a read of the certificates.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone

import asyncpg
from temporalio.common import MetricMeter

from certflow.edge.maintain import EdgeFollower
from certflow.store import edges
from certflow.store.edges import EdgeRecord

log = logging.getLogger(__name__)

REPORT_SECONDS = 10.0


class EdgeMonitor:
    """Reports one follower's state as the edge ``name`` of ``kind``."""

    def __init__(
        self,
        follower: EdgeFollower,
        pool: asyncpg.Pool,
        *,
        name: str,
        kind: str,
        tls_address: str | None,
        meter: MetricMeter = MetricMeter.noop,
    ) -> None:
        self._follower = follower
        self._pool = pool
        self._record = EdgeRecord(
            name=name, kind=kind, tls_address=tls_address, started_at=datetime.now(timezone.utc),
            heartbeat_at=datetime.now(timezone.utc), converged_at=None, synced_at=None, held=0,
            push_failures=0,
        )
        labels = {"edge": name, "kind": kind}
        self._held = meter.create_gauge_float(
            "certflow_edge_certificates_held", "Certificates the edge holds from certflow"
        ).with_additional_attributes(labels)
        self._lag = meter.create_gauge_float(
            "certflow_edge_lag_seconds",
            "Seconds since the edge last held every committed change (about the poll interval when current)",
            "s",
        ).with_additional_attributes(labels)
        self._converged = meter.create_gauge_float(
            "certflow_edge_last_converge_timestamp_seconds", "When the edge last converged from the rows", "s"
        ).with_additional_attributes(labels)
        self._failures = meter.create_counter(
            "certflow_edge_push_failures_total", "Pushes and removals the edge could not take"
        ).with_additional_attributes(labels)
        self._failures_seen = 0

    def report(self) -> EdgeRecord:
        """Update the metrics; the row to write."""
        follower, now = self._follower, datetime.now(timezone.utc)
        self._held.set(float(follower.held))
        started = self._record.started_at
        self._lag.set((now - (follower.synced_at or started)).total_seconds())
        if follower.converged_at is not None:
            self._converged.set(follower.converged_at.timestamp())
        if follower.push_failures > self._failures_seen:
            self._failures.add(follower.push_failures - self._failures_seen)
            self._failures_seen = follower.push_failures
        self._record = EdgeRecord(
            name=self._record.name, kind=self._record.kind, tls_address=self._record.tls_address,
            started_at=started, heartbeat_at=now, converged_at=follower.converged_at,
            synced_at=follower.synced_at, held=follower.held, push_failures=follower.push_failures,
        )
        return self._record

    async def run(self, stop: asyncio.Event, every: float = REPORT_SECONDS) -> None:
        """Report every ``every`` seconds until ``stop``; a write that fails is
        skipped (the follower already says Postgres is away)."""
        while not stop.is_set():
            record = self.report()
            try:
                await edges.record(self._pool, record)
            except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
                log.debug("edge: report not written: %s", err)
            try:
                await asyncio.wait_for(stop.wait(), every)
            except asyncio.TimeoutError:
                pass
