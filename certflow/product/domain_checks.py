"""DomainCheck runs as the client starts them: one now for the "verify" button
(``CertflowClient.check``), or a shared, recent one for a status page that polls
(``CertflowClient.status(methods=True)``).

A product that shows each method's readiness beside a pending hostname polls
its status every few seconds, from several browser tabs at once. Each check is
a workflow start and an activity task (billable, and DNS queries at the
resolver), so status shares one: at most one in flight per hostname and tenant,
and a finished one is reused while it is younger than :data:`FRESH_SECONDS`.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from certflow.contract import DOMAIN_CHECK_WORKFLOW, domain_check_workflow_id
from certflow.hostnames import Hostname
from certflow.workflow_payloads import DomainCheckInput, DomainCheckReport

FRESH_SECONDS = 60.0
"""How long a finished check answers status pages: about the time a customer
takes to add a record and come back to the page."""


async def check_now(
    temporal: Client, task_queue: str, hostname: Hostname, tenant_id: str | None
) -> DomainCheckReport:
    """A new check, whatever ran before (the customer pressed "verify")."""
    report: DomainCheckReport = await temporal.execute_workflow(
        DOMAIN_CHECK_WORKFLOW,
        DomainCheckInput(hostname=hostname, tenant_id=tenant_id),
        id=domain_check_workflow_id(hostname, uuid.uuid4().hex[:12]),
        task_queue=task_queue,
        result_type=DomainCheckReport,
    )
    return report


def shared_check_id(hostname: Hostname, tenant_id: str | None) -> str:
    """The id the status pages of one hostname and tenant share (the tenant as a
    digest: a check for another tenant is another check)."""
    tenant = hashlib.sha256((tenant_id or "").encode()).hexdigest()[:12]
    return domain_check_workflow_id(hostname, f"status-{tenant}")


async def recent_check(
    temporal: Client,
    task_queue: str,
    hostname: Hostname,
    tenant_id: str | None,
    *,
    fresh_seconds: float = FRESH_SECONDS,
) -> DomainCheckReport:
    """The check in flight for this hostname and tenant, or one finished within
    ``fresh_seconds``, or a new one that later callers share."""
    workflow_id = shared_check_id(hostname, tenant_id)
    handle = temporal.get_workflow_handle(workflow_id, result_type=DomainCheckReport)
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status is not RPCStatusCode.NOT_FOUND:
            raise
    else:
        fresh_since = datetime.now(timezone.utc) - timedelta(seconds=fresh_seconds)
        running = described.status is WorkflowExecutionStatus.RUNNING
        recent = (
            described.status is WorkflowExecutionStatus.COMPLETED
            and described.close_time is not None
            and described.close_time > fresh_since
        )
        if running or recent:
            report: DomainCheckReport = await temporal.get_workflow_handle(
                workflow_id, run_id=described.run_id, result_type=DomainCheckReport
            ).result()
            return report
    started = await temporal.start_workflow(
        DOMAIN_CHECK_WORKFLOW,
        DomainCheckInput(hostname=hostname, tenant_id=tenant_id),
        id=workflow_id,
        task_queue=task_queue,
        result_type=DomainCheckReport,
        # Two pages that both found nothing fresh share the one the first started.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    shared: DomainCheckReport = await started.result()
    return shared
