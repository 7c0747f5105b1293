"""certflow's async client: what a product backend (or ``starter.py``) calls.

It validates hostnames, upserts the certificate rows and starts (or finds) one
workflow per hostname; it reads the status from the row (the system of record)
joined with the running workflow's view, and sends the workflow's updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from certflow.store import cooldowns, requests
from certflow.contract import (
    CERTIFICATE_WORKFLOW, RECONCILE_WORKFLOW, reconcile_schedule_id, workflow_id_for,
)
from certflow.connect.connections import CONNECT_TIMEOUT_SECONDS, open_postgres, open_temporal
from certflow.product.domain_checks import check_now, recent_check
from certflow.connect.payload_codec import data_converter
from certflow.connect.temporal_config import load_temporal_connection
from certflow.hostnames import (
    Hostname, InvalidHostnameError, as_hostname, is_wildcard, normalize_hostname, normalize_tenant_id
)
from certflow.dns.ownership import ownership_record
from certflow.models import (
    CertificateEvent, CertificateStatus, Cooldown, DnsRecord, LimitScope, Phase, RequestedMethod
)
from certflow.workflow_payloads import (
    TransferRequest,
    CertificateState,
    DeleteRequest,
    DomainCheckReport,
    ReconcileInput,
    ReconcileResult,
)
from certflow.running.schedules import install_reconcile_schedule
from certflow.product.starts import CertificateStarts, certificate_input
from certflow.connect.settings import ClientSettings
from certflow.errors import ActionRejectedError, HostnameOwnedError

START_CONCURRENCY = 16
CATCH_UP_SECONDS = 10.0
"""How long ``renew`` waits for a workflow to show the ACTIVE row it just stored."""
CATCH_UP_POLL_SECONDS = 0.05


def _validated(hostnames: Sequence[str]) -> list[Hostname]:
    """Each hostname validated (the first bad one raises InvalidHostnameError), each
    once, in the order given."""
    validated = [as_hostname(raw) for raw in hostnames]
    return list(dict.fromkeys(validated))


def _limit_scope(scope: str | None, key: str | None) -> LimitScope | None:
    if scope is None:
        if key is not None:
            raise ActionRejectedError("a cooldown key needs its scope (--scope)")
        return None
    try:
        return LimitScope(scope)
    except ValueError:
        known = ", ".join(s.value for s in LimitScope)
        raise ActionRejectedError(f"unknown cooldown scope {scope!r} (one of: {known})") from None


def _rejection(err: WorkflowUpdateFailedError) -> str:
    cause = err.cause
    return str(getattr(cause, "message", None) or cause or err)


class CertflowClient:
    """Request certificates, read their status, and act on them."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        temporal: Client,
        task_queue: str,
        ownership_secret: bytes | None = None,
        *,
        hostname_attribute: bool = True,
    ) -> None:
        self.pool = pool
        self.temporal = temporal
        self.task_queue = task_queue
        self.ownership_secret = ownership_secret
        self._starts = CertificateStarts(temporal, task_queue, hostname_attribute=hostname_attribute)

    @classmethod
    async def connect(
        cls, settings: ClientSettings, *, timeout: float = CONNECT_TIMEOUT_SECONDS
    ) -> CertflowClient:
        """Postgres first, then Temporal; either unreachable is ServiceUnreachableError
        (naming the address and the setting) within ``timeout`` each."""
        connection = load_temporal_connection(settings)
        converter = data_converter(settings)
        pool = await open_postgres(settings.database_url, max_size=4, timeout=timeout)
        try:
            temporal = await open_temporal(connection, data_converter=converter, timeout=timeout)
        except BaseException:
            await pool.close()
            raise
        return cls(
            pool,
            temporal,
            settings.task_queue,
            settings.ownership_secret_bytes,
            hostname_attribute=settings.hostname_search_attribute,
        )

    async def close(self) -> None:
        await self.pool.close()

    async def request(
        self,
        hostnames: Sequence[str],
        tenant_id: str | None = None,
        method: RequestedMethod | None = None,
    ) -> list[Hostname]:
        """Validate every hostname first (one bad name writes nothing), then upsert
        each row and start its workflow, or find the one already running; returns
        the hostnames as validated, each once.

        A hostname of another tenant is refused: HostnameOwnedError, nothing
        requested (an event on that row says so). Without ``tenant_id`` a row keeps
        its tenant. ``method``: how the CA is to be shown control (None keeps the
        row's, ``auto`` for a new one); a wildcard is never http-01."""
        unique = _validated(hostnames)
        if tenant_id is not None:
            tenant_id = normalize_tenant_id(tenant_id)
        if method is RequestedMethod.HTTP_01:
            for hostname in unique:
                if is_wildcard(hostname):
                    raise InvalidHostnameError(
                        hostname, "a wildcard is validated over DNS only (dns-01 or dns-persist-01)"
                    )
        requested = await requests.request_certificates(self.pool, unique, tenant_id, method)
        if requested.refused:
            raise HostnameOwnedError(requested.refused)
        # Starts are independent round trips to Temporal: a few at a time.
        slots = asyncio.Semaphore(START_CONCURRENCY)

        async def start(hostname: Hostname) -> None:
            async with slots:
                await self._starts.start(hostname, tenant_id, method, requested.rows.get(hostname))

        await asyncio.gather(*(start(h) for h in unique))
        return unique

    def handle(self, hostname: str) -> WorkflowHandle[Any, Any]:
        """The hostname's Certificate workflow (its name validated: InvalidHostnameError)."""
        return self.temporal.get_workflow_handle(workflow_id_for(as_hostname(hostname)))

    async def status(self, hostname: str, *, methods: bool = False) -> CertificateState | None:
        """The row, with the running workflow's phase and next attempt; None when
        there is no row for the hostname. With ``methods``, a PENDING certificate also
        gets each validation method's readiness and the record to add (a ``check``
        run now, or shared: certflow/product/domain_checks.py): what a product shows next to
        its "verify" button. Calls for one hostname share a check in flight or one
        finished within a minute, so a page that polls starts about one a minute."""
        hostname = as_hostname(hostname)
        row = await requests.certificate_state(self.pool, hostname)
        if row is None:
            return None
        update: dict[str, Any] = {"workflow_id": workflow_id_for(hostname)}
        if methods and row.status is CertificateStatus.PENDING:
            report = await recent_check(self.temporal, self.task_queue, hostname, row.tenant_id)
            update["methods"] = report.methods
        if row.status is not CertificateStatus.ACTIVE:
            holding = await self.cooldowns_for(hostname)
            if holding:
                update["cooldowns"] = holding
                update["cooldown_until"] = holding[0].until
        try:
            state = await self.handle(hostname).query("status", result_type=CertificateState)
        except RPCError:
            pass  # no workflow (or none running): the row says it all
        else:
            update["phase"] = state.phase
            update["next_attempt_at"] = state.next_attempt_at
        update["ownership"] = self.ownership_record(hostname, row.tenant_id)
        return row.model_copy(update=update)

    async def list_certificates(self, status: str | None = None) -> list[CertificateState]:
        """Certificates from Postgres (the rows alone), optionally of one status."""
        return await requests.list_certificates(self.pool, status)

    async def events(self, hostname: str) -> list[CertificateEvent]:
        """The certificate's transitions, oldest first."""
        return await requests.events(self.pool, as_hostname(hostname))

    async def retry(self, hostname: str) -> CertificateState:
        """Retry now (the ``retry`` update): rejected when there is nothing to retry."""
        return await self._update(as_hostname(hostname), "retry")

    def ownership_record(self, hostname: str, tenant_id: str | None) -> DnsRecord | None:
        """The record that proves ``tenant_id`` owns ``hostname`` (None without
        OWNERSHIP_SECRET): what the product tells its customer to add."""
        if self.ownership_secret is None:
            return None
        return ownership_record(self.ownership_secret, tenant_id, as_hostname(hostname))

    async def transfer(self, hostname: str, to_tenant: str) -> CertificateState:
        """Move a hostname to another tenant (the ``transfer`` update): done on a worker
        once that tenant's ownership record is seen, refused otherwise (nothing
        changed); an ACTIVE certificate is then renewed with a new key."""
        to_tenant = normalize_tenant_id(to_tenant)
        return await self._update(
            as_hostname(hostname), "transfer", TransferRequest(to_tenant=to_tenant)
        )

    async def renew(self, hostname: str) -> CertificateState:
        """Renew an ACTIVE certificate now (the ``renew`` update).

        A row that has just turned ACTIVE renews too: its workflow learns of the
        certificate it stored one workflow task later, and hands over to the run
        that waits for the renewal time after that; until then it refuses a renew.
        When the row says ACTIVE and the workflow does not show it yet, the update
        is asked again once it does (within CATCH_UP_SECONDS)."""
        hostname = as_hostname(hostname)
        try:
            return await self._update(hostname, "renew")
        except ActionRejectedError:
            if not await self._caught_up_with_active_row(hostname):
                raise
        return await self._update(hostname, "renew")

    async def _caught_up_with_active_row(self, hostname: Hostname) -> bool:
        """Whether the row is ACTIVE while the workflow was behind it, and the
        workflow now waits for the renewal time (False: the refusal stands)."""
        row = await requests.certificate_state(self.pool, hostname)
        if row is None or row.status is not CertificateStatus.ACTIVE:
            return False
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while time.monotonic() < deadline:
            try:
                shown: CertificateState = await self.handle(hostname).query(
                    "status", result_type=CertificateState
                )
            except (RPCError, WorkflowQueryFailedError):
                pass  # handing over to its next run: not caught up yet
            else:
                if shown.status is CertificateStatus.ACTIVE and shown.phase is not Phase.ISSUED:
                    return True
            await asyncio.sleep(CATCH_UP_POLL_SECONDS)
        return False

    async def cancel(self, hostname: str) -> CertificateState:
        """Stop provisioning and renewal: CANCELED, the open authorization deactivated."""
        return await self._update_with_start(as_hostname(hostname), "cancel", None)

    async def delete(self, hostname: str, *, revoke: bool = False) -> CertificateState:
        """Cancel, optionally revoke the current certificate, and remove the rows."""
        return await self._update_with_start(
            as_hostname(hostname), "delete", DeleteRequest(revoke=revoke)
        )

    async def cooldowns(self) -> list[Cooldown]:
        """Every rate-limit cooldown in force (any CA, any scope), longest first."""
        return await cooldowns.active_cooldowns(self.pool)

    async def cooldowns_for(self, hostname: str) -> list[Cooldown]:
        """The cooldowns in force that hold back hostname's next order: the account's,
        its registered domain's, its own (less those its renewal is exempt from)."""
        return await cooldowns.holding_back(self.pool, as_hostname(hostname))

    async def clear_cooldowns(
        self, scope: str | None = None, key: str | None = None
    ) -> list[Hostname]:
        """End the cooldowns in force — all, those of one scope, or the one of a scope's
        key (after the CA lifted a limit) — and wake the workflows waiting for them;
        returns their hostnames. An unknown scope, a key without a scope, or no such
        cooldown is refused (ActionRejectedError) and changes nothing."""
        chosen = _limit_scope(scope, key)
        if chosen is not None and key is not None:
            if chosen is not LimitScope.ACCOUNT:
                try:
                    key = normalize_hostname(key)
                except InvalidHostnameError as err:
                    raise ActionRejectedError(f"no cooldown in force for {chosen} {key!r}: {err}") from None
            held = [
                c
                for c in await cooldowns.active_cooldowns(self.pool)
                if c.scope is chosen and c.scope_key == key
            ]
            if not held:
                raise ActionRejectedError(f"no cooldown in force for {chosen} {key!r}")
        cleared = await cooldowns.clear_cooldowns(self.pool, chosen, key)
        waiting = [
            h for h in await requests.waiting_for_cooldown(self.pool) if cooldowns.held_back(h, cleared)
        ]
        for hostname in waiting:
            with contextlib.suppress(RPCError):
                await self.handle(hostname).signal("retry")
        return waiting

    async def check(
        self, hostnames: Sequence[str], tenant_id: str | None = None
    ) -> list[DomainCheckReport]:
        """Run every pre-check (each validation method with the record to add, CAA,
        HTTP-01 reachability; with ``tenant_id``, that tenant's proof of ownership) of
        each hostname on a worker — where the resolver and the network view are —
        ordering nothing: the product's "verify my domain" button. Hostnames are
        validated first."""
        unique = _validated(hostnames)
        return list(
            await asyncio.gather(*(check_now(self.temporal, self.task_queue, h, tenant_id) for h in unique))
        )

    async def install_reconcile(self, every_seconds: float) -> None:
        await install_reconcile_schedule(self.temporal, self.task_queue, every_seconds)

    async def reconcile_now(self, *, full: bool = False) -> ReconcileResult:
        """One reconcile pass, run by a worker, waited for (``full``: also compare
        every row with every running workflow, the O(rows) pass)."""
        result: ReconcileResult = await self.temporal.execute_workflow(
            RECONCILE_WORKFLOW,
            ReconcileInput(full=full),
            id=f"{reconcile_schedule_id(self.task_queue)}:manual-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
            result_type=ReconcileResult,
        )
        return result

    async def _update(
        self, hostname: Hostname, update: str, arg: TransferRequest | None = None
    ) -> CertificateState:
        try:
            state: CertificateState = await self.handle(hostname).execute_update(
                update, args=[] if arg is None else [arg], result_type=CertificateState
            )
        except WorkflowUpdateFailedError as err:
            raise ActionRejectedError(_rejection(err)) from None
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                raise ActionRejectedError(
                    f"{hostname} has no running workflow (request it first)"
                ) from None
            raise
        return state

    async def _update_with_start(
        self, hostname: Hostname, update: str, arg: DeleteRequest | None
    ) -> CertificateState:
        """Deliver the update, starting the workflow first if none runs (so a worker,
        which holds the ACME account, carries it out)."""
        row = await requests.certificate_state(self.pool, hostname)
        if row is None:
            raise ActionRejectedError(f"no certificate for {hostname}")
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            CERTIFICATE_WORKFLOW,
            certificate_input(hostname, row.tenant_id),
            id=workflow_id_for(hostname),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            state: CertificateState = await self.temporal.execute_update_with_start_workflow(
                update,
                arg,
                start_workflow_operation=start,
                result_type=CertificateState,
            )
        except WorkflowUpdateFailedError as err:
            raise ActionRejectedError(_rejection(err)) from None
        return state

    async def wait(
        self, hostnames: Sequence[str], timeout: float, poll_interval: float = 0.2
    ) -> dict[str, CertificateState | None]:
        """Wait until each hostname is ACTIVE or carries an error code (or timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            reports = {h: await self.status(h) for h in hostnames}
            settled = all(
                r is not None and (r.status is CertificateStatus.ACTIVE or r.error_code)
                for r in reports.values()
            )
            if settled or time.monotonic() >= deadline:
                return reports
            await asyncio.sleep(poll_interval)
