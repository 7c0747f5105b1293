"""The reconcile activity: start the Certificate workflow of every row that should
have one running and has none, at a cost that follows the changes, not the rows.

Two cheap reads find them: the rows no workflow ever ran for (``workflow_seen_at``
is written by a workflow's first step: an indexed, usually empty read), and
the Certificate workflows that ended since the last passes (a visibility query
by close time). A row inserted by SQL is normalized here first (a U-label gets
its A-label, the workflow id is the one ``request`` computes); one that is not a
valid hostname is refused — CANCELED with INVALID_HOSTNAME and the reason — and
never started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import asyncpg
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from activities.pass_heartbeat import PassHeartbeat
from activities.pass_metrics import counted_pass
from certflow.store import reconcile
from certflow.store.reconcile import ReconcileRow
from certflow.contract import CERTIFICATE_WORKFLOW, workflow_id_for
from certflow.hostnames import Hostname, InvalidHostnameError, normalize_hostname
from certflow.product.starts import certificate_input
from certflow.workflow_payloads import ReconcileInput, ReconcileResult

PAGE = 500


class _Pass:
    """What one pass did so far."""

    def __init__(self) -> None:
        self.heartbeat = PassHeartbeat()
        self.checked = 0
        self.started: list[str] = []
        self.refused: list[str] = []
        self.started_count = 0
        self.refused_count = 0

    def add_started(self, hostname: str) -> None:
        self.started_count += 1
        if len(self.started) < ReconcileResult.LISTED:
            self.started.append(hostname)
        # Per start, not per page: a cold pass starts ~13 workflows a second, so a
        # page of 500 takes longer than the heartbeat timeout.
        self.heartbeat.now(self.started_count)

    def add_refused(self, hostname: str) -> None:
        self.refused_count += 1
        if len(self.refused) < ReconcileResult.LISTED:
            self.refused.append(hostname)

    def result(self) -> ReconcileResult:
        return ReconcileResult(
            checked=self.checked,
            started=self.started,
            refused=self.refused,
            started_count=self.started_count,
            refused_count=self.refused_count,
        )

START_CONCURRENCY = 16
# Workflows that ended (for good: not continued-as-new) may need starting again.
_ENDED = " OR ".join(
    f'ExecutionStatus="{s}"' for s in ("Completed", "Failed", "Canceled", "Terminated", "TimedOut")
)


class ReconcileActivities:
    """Starts the missing Certificate workflows."""

    def __init__(
        self, pool: asyncpg.Pool, client: Client, task_queue: str, interval_seconds: float = 300.0
    ) -> None:
        self._pool = pool
        self._client = client
        self._task_queue = task_queue
        # Each pass looks back over two intervals: a pass that was skipped or late
        # loses nothing; a workflow seen twice is started once (USE_EXISTING).
        self._look_back = timedelta(seconds=2 * max(interval_seconds, 60.0) + 60.0)

    @activity.defn(name="reconcile_certificates")
    async def reconcile_certificates(self, input: ReconcileInput | None = None) -> ReconcileResult:
        """Start a workflow for each row that should have one and has none."""
        async with counted_pass("reconcile"):
            return await self._reconcile(input)

    async def _reconcile(self, input: ReconcileInput | None) -> ReconcileResult:
        result = _Pass()
        slots = asyncio.Semaphore(START_CONCURRENCY)
        if input is not None and input.full:
            rows = await reconcile.all_open_rows(self._pool)
            running = {e.id async for e in self._client.list_workflows(
                f'WorkflowType="{CERTIFICATE_WORKFLOW}" AND ExecutionStatus="Running"'
            )}
            missing = [r for r in rows if workflow_id_for(r.hostname) not in running]
            await self._start_all(missing, result, slots)
            result.checked += len(rows)
            return self._logged(result)
        after: tuple[datetime, str] | None = None
        while True:
            page = await reconcile.rows_without_workflow(self._pool, after, PAGE)
            await self._start_all(page, result, slots)
            result.checked += len(page)
            # Only a long pass: one that starts nothing (every steady pass) sends none.
            result.heartbeat.maybe(result.started_count)
            if len(page) < PAGE:
                break
            last = page[-1]
            assert last.created_at is not None
            after = (last.created_at, last.certificate_id)
        ended = await self._ended_hostnames()
        if ended:
            rows = await reconcile.rows_to_restart(self._pool, ended)
            await self._start_all(rows, result, slots)
            result.checked += len(rows)
        return self._logged(result)

    async def _ended_hostnames(self) -> list[str]:
        since = (datetime.now(timezone.utc) - self._look_back).isoformat().replace("+00:00", "Z")
        query = f'WorkflowType="{CERTIFICATE_WORKFLOW}" AND ({_ENDED}) AND CloseTime > "{since}"'
        prefix = workflow_id_for("")
        found = {
            e.id.removeprefix(prefix)
            async for e in self._client.list_workflows(query)
            if e.id.startswith(prefix)
        }
        return sorted(found)

    async def _start_all(
        self, rows: Sequence[ReconcileRow], result: _Pass, slots: asyncio.Semaphore
    ) -> None:
        async def one(row: ReconcileRow) -> None:
            hostname = await self._normalized(row, result)
            if hostname is None:
                return
            async with slots:
                # Visibility lags a little: USE_EXISTING keeps a race harmless.
                await self._client.start_workflow(
                    CERTIFICATE_WORKFLOW,
                    certificate_input(hostname, row.tenant_id),
                    id=workflow_id_for(hostname),
                    task_queue=self._task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                )
            result.add_started(hostname)

        await asyncio.gather(*(one(r) for r in rows))

    async def _normalized(self, row: ReconcileRow, result: _Pass) -> Hostname | None:
        """The row's hostname as ``request`` spells it (the row renamed to it), or None
        when the row was refused."""
        try:
            hostname = normalize_hostname(row.hostname)
        except InvalidHostnameError as err:
            await reconcile.refuse_hostname(self._pool, row.certificate_id, str(err))
            result.add_refused(row.hostname)
            return None
        if hostname != row.hostname and not await reconcile.rename(
            self._pool, row.certificate_id, hostname
        ):
            await reconcile.refuse_hostname(
                self._pool,
                row.certificate_id,
                f"{row.hostname!r} is {hostname}, which another row already has",
            )
            result.add_refused(row.hostname)
            return None
        return hostname

    def _logged(self, result: _Pass) -> ReconcileResult:
        if result.started_count or result.refused_count:
            activity.logger.info(
                "reconcile started %d workflows, refused %d rows",
                result.started_count,
                result.refused_count,
            )
        return result.result()
