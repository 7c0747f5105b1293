"""The Reconcile workflow: start the Certificate workflow of every certificate row
that should have one running and has none (a row the product inserted directly,
a workflow terminated by hand), then prune the event log to its retention. Run on
a Temporal Schedule; replaces the original's stale-row sweep."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.reconcile import ReconcileActivities
    from activities.retention import RetentionActivities
    from certflow.workflow_payloads import ReconcileInput, ReconcileResult
    from certflow.contract import RECONCILE_WORKFLOW


EVENT_RETENTION_PATCH = "event-retention"
"""After the pass, certificate_events is pruned to its retention."""


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
        if workflow.patched(EVENT_RETENTION_PATCH):
            # Best effort: the next pass goes on where this one stopped.
            await workflow.execute_activity_method(
                RetentionActivities.prune_events,
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        return result
