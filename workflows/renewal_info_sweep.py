"""The RenewalInfoSweep workflow: one pass of the renewal-info sweep (ARI for every
due certificate, activities/renewal_info.py), run on a Temporal Schedule."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.renewal_info import RenewalInfoSweep
    from certflow.contract import RENEWAL_INFO_SWEEP_WORKFLOW
    from certflow.workflow_payloads import RenewalInfoSweepResult


@workflow.defn(name=RENEWAL_INFO_SWEEP_WORKFLOW)
class RenewalInfoSweepWorkflow:
    """One sweep."""

    @workflow.run
    async def run(self) -> RenewalInfoSweepResult:
        return await workflow.execute_activity_method(
            RenewalInfoSweep.sweep_renewal_info,
            start_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(minutes=2),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
