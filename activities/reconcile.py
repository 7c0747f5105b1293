"""The reconcile activity: compare certificate rows with running workflows."""

from __future__ import annotations

import asyncpg
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from certflow import certificates
from certflow.contract import CERTIFICATE_WORKFLOW, workflow_id_for
from certflow.models import CertificateInput, ReconcileResult


class ReconcileActivities:
    """Starts the missing Certificate workflows."""

    def __init__(self, pool: asyncpg.Pool, client: Client, task_queue: str) -> None:
        self._pool = pool
        self._client = client
        self._task_queue = task_queue

    @activity.defn(name="reconcile_certificates")
    async def reconcile_certificates(self) -> ReconcileResult:
        """Start a workflow for each non-canceled row that has none running."""
        running: set[str] = set()
        query = f'WorkflowType="{CERTIFICATE_WORKFLOW}" AND ExecutionStatus="Running"'
        async for execution in self._client.list_workflows(query):
            running.add(execution.id)
            activity.heartbeat()
        rows = await certificates.reconcile_candidates(self._pool)
        started: list[str] = []
        for row in rows:
            workflow_id = workflow_id_for(row["hostname"])
            if workflow_id in running:
                continue
            # Visibility lags a little: USE_EXISTING keeps a race harmless.
            await self._client.start_workflow(
                CERTIFICATE_WORKFLOW,
                CertificateInput(hostname=row["hostname"], tenant_id=row["tenant_id"]),
                id=workflow_id,
                task_queue=self._task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
            started.append(row["hostname"])
            activity.heartbeat()
        if started:
            activity.logger.info("reconcile started %d workflows", len(started))
        return ReconcileResult(checked=len(rows), started=started)
