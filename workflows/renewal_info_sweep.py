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
            # As long as the default interval (an hour: 8,300 checks at 100,000
            # certificates, 7 minutes at the default pace; the pace, 20 a second,
            # caps a sweep near 72,000 checks an hour).
            start_to_close_timeout=timedelta(hours=1),
            # The sweep heartbeats once half of this has passed (activities/
            # pass_heartbeat.py): a lost worker is noticed within 10 minutes, and a
            # sweep at 100,000 certificates sends one heartbeat, a small one none.
            # Timeouts are not compared on replay: no patch.
            heartbeat_timeout=timedelta(minutes=10),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
