"""The Reconcile workflow: start the Certificate workflow of every certificate row
that should have one running and has none (a row the product inserted directly,
a workflow terminated by hand). Run on a Temporal Schedule; replaces the
original's stale-row sweep."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from certflow.models import ReconcileResult
    from certflow.schedules import RECONCILE_WORKFLOW_TYPE


@workflow.defn(name=RECONCILE_WORKFLOW_TYPE)
class ReconcileWorkflow:
    """One reconcile pass."""

    @workflow.run
    async def run(self) -> ReconcileResult:
        result: ReconcileResult = await workflow.execute_activity(
            "reconcile_certificates",
            result_type=ReconcileResult,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        return result
