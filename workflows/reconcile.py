"""The Reconcile workflow: start the Certificate workflow of every certificate row
that should have one running and has none (a row the product inserted directly,
a workflow terminated by hand); the passes that start in the first hour of the UTC
day also prune the event log to its retention. Run on a Temporal Schedule;
replaces the original's stale-row sweep.

A pass is one activity (and its schedule's firing): every billable action a pass
adds is paid every interval, so it records no patch marker and prunes once a
day, not after every pass (docs/performance.md, "The schedules")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.reconcile import ReconcileActivities
    from activities.retention import RetentionActivities
    from certflow.workflow_payloads import ReconcileInput, ReconcileResult
    from certflow.contract import RECONCILE_WORKFLOW


EVENT_RETENTION_PATCH = "event-retention"
"""The marker of passes recorded by older code, which pruned certificate_events
after every pass. Today's passes never record it: only a replay asks for it
(``_prunes``), to follow a history that holds it."""

PRUNE_HOURS = timedelta(hours=1)
"""The passes that start this long after midnight UTC or less also prune: at the
default 15-minute interval four a day (each a cheap no-op after the first), one
at least with any interval of an hour or less."""


def prune_due(started: datetime) -> bool:
    """Whether the pass that started at ``started`` prunes the event log: it started
    in the first PRUNE_HOURS of its UTC day."""
    utc = started.astimezone(timezone.utc)
    return utc - utc.replace(hour=0, minute=0, second=0, microsecond=0) < PRUNE_HOURS


@workflow.defn(name=RECONCILE_WORKFLOW)
class ReconcileWorkflow:
    """One reconcile pass."""

    @workflow.run
    async def run(self, input: ReconcileInput | None = None) -> ReconcileResult:
        result: ReconcileResult = await workflow.execute_activity_method(
            ReconcileActivities.reconcile_certificates,
            input,
            # A cold pass over 100,000 rows starts workflows for about two hours;
            # the heartbeat (one per start) is what detects a lost worker.
            start_to_close_timeout=timedelta(hours=4),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        if self._prunes():
            # Best effort: the next day's pass goes on where this one stopped.
            await workflow.execute_activity_method(
                RetentionActivities.prune_events,
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        return result

    @staticmethod
    def _prunes() -> bool:
        """Whether this pass prunes. A pass recorded by older code pruned after every
        pass and holds the EVENT_RETENTION_PATCH marker: a replay of it asks for the
        marker (found: the old path). A pass of this code never asks while it runs,
        so it records no marker (two history events, and an action each time the
        schedule fires); replayed, it asks, finds none, and decides as it did, from
        its start time. Passes recorded before that patch existed (no marker, no
        prune) ended long ago: a pass lasts seconds, a cold one hours."""
        if workflow.unsafe.is_replaying() and workflow.patched(EVENT_RETENTION_PATCH):
            return True
        return prune_due(workflow.info().workflow_start_time)
