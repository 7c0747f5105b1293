"""The DomainCheck workflow: every pre-check of one hostname (CNAME, CAA, HTTP-01
reachability), run by a worker — where the resolver and the network view are —
for ``starter.py check`` and ``CertflowClient.check``. Nothing is ordered."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.preflight import PreflightActivities
    from certflow.contract import DOMAIN_CHECK_WORKFLOW
    from certflow.workflow_payloads import DomainCheckInput, DomainCheckReport


@workflow.defn(name=DOMAIN_CHECK_WORKFLOW)
class DomainCheckWorkflow:
    """One check of one hostname."""

    @workflow.run
    async def run(self, input: DomainCheckInput) -> DomainCheckReport:
        return await workflow.execute_activity_method(
            PreflightActivities.check_domain,
            input,
            start_to_close_timeout=timedelta(seconds=90),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )
