"""What every phase of the Certificate workflow shares: the row and the phase as the
product sees them (search attributes, current details, the status query), durable
sleeps that signals cut short, webhooks, and what the next run is handed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import ActivityError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.dns import DnsActivities
    from activities.records import RecordActivities
    from certflow import search
    from certflow.contract import WEBHOOK_DELIVERY_WORKFLOW, webhook_workflow_id
    from certflow.errors import ErrorCode
    from certflow.models import CertificateRecord, CertificateStatus, RequestedMethod, Phase
    from certflow.workflow_payloads import CarriedWaits, CertificateInput, CertificateState, WebhookEvent
    from certflow.activity_payloads import Dns01ChallengeInput, EnsureCertificateInput, GiveUpInput
    from workflows.run_state import RunState, Stopped
    from workflows.patches import (
        CURRENT_DESIGN,
        MIGRATE_AT_WAIT_PATCH,
        RUN_KEPT_AFTER_ISSUANCE_DESIGN,
        RUN_KEPT_BELOW_EVENTS,
    )
    from workflows.steps import BEST_EFFORT, POSTGRES, POSTGRES_LOCAL, run, run_local

S = TypeVar("S")
A = TypeVar("A")
R = TypeVar("R")


class CertificateBase:
    """The state and plumbing every phase uses; the phases are mixins of it."""

    _state: RunState

    @property
    def _record(self) -> CertificateRecord:
        """The row as this run knows it (read at the start of every run)."""
        return self._state.record

    def _set_record(self, record: CertificateRecord) -> None:
        self._state.current = record
        self._publish()

    def _set_written(
        self, row: CertificateRecord | None, before: CertificateRecord, **wrote: Any
    ) -> CertificateRecord:
        """The record after a guarded transition: the row it returned; without one
        (histories from before transitions returned their row, or a transition that
        found no row to write), ``before`` with what the transition wrote, as those
        runs went on."""
        record = row if row is not None else before.model_copy(update=wrote)
        self._set_record(record)
        return record

    def _enter(self, phase: Phase) -> None:
        self._state.phase = phase
        self._publish()

    def _expiring_soon_at(self) -> datetime | None:
        record = self._record
        if self._state.warned_expiring or record is None or record.expires_at is None:
            return None
        return record.expires_at - timedelta(days=self._state.policy.expiring_soon_days)

    async def _warn_if_expiring(self) -> None:
        """An 'expiring_soon' event once a renewal has not succeeded by then."""
        moment = self._expiring_soon_at()
        record = self._record
        renewing = record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
        if moment is not None and renewing and workflow.now() >= moment:
            self._state.warned_expiring = True
            await self._notify("expiring_soon")

    async def _notify(
        self, event: str, serial: str | None = None, about: CertificateRecord | None = None
    ) -> None:
        """Hand the event to a WebhookDelivery child that retries on its own and
        outlives this run (continue-as-new, cancel); ``about``: the record as this
        event describes it (the old tenant's view of a transfer), else the current."""
        record = about or self._record
        if not self._state.policy.webhooks or record is None:
            return
        event_id = str(workflow.uuid4())
        await workflow.start_child_workflow(
            WEBHOOK_DELIVERY_WORKFLOW,
            WebhookEvent(
                event_id=event_id,
                event=event,
                hostname=record.hostname,
                tenant_id=record.tenant_id,
                status=record.status,
                error_code=record.error_code,
                error_message=record.error_message,
                serial=serial,
                expires_at=record.expires_at,
                occurred_at=workflow.now(),
                issuer=self._state.issuer or record.issuer,
                issuer_reason=self._state.issuer_reason,
            ),
            id=webhook_workflow_id(record.hostname, event_id),
            parent_close_policy=ParentClosePolicy.ABANDON,
        )

    @property
    def _row_just_read(self) -> bool:
        """The row was read in this workflow task: nothing waited since (any wait
        ends the task, and the next one starts later)."""
        return self._state.row_read_at == workflow.now()

    async def _postgres(self, activity: Callable[[S, A], Awaitable[R]], arg: A) -> R:
        """A step that only touches Postgres: local (a marker, no task of its own), a
        regular activity when Postgres has not answered it within a minute."""
        try:
            return await run_local(POSTGRES_LOCAL, activity, arg)
        except ActivityError:
            workflow.logger.warning("Postgres did not answer a local step: retrying it as an activity")
        return await run(POSTGRES, activity, arg)

    async def _read_row(
        self,
        tenant_id: str | None,
        method: RequestedMethod | None = None,
        requested: CertificateRecord | None = None,
    ) -> None:
        """The row and the worker's policy, read (the row made if missing; a method
        the workflow's input asked for becomes the row's); ``requested``, the row a
        request has just written, is taken as read."""
        ensured = await self._postgres(
            RecordActivities.ensure_certificate,
            EnsureCertificateInput(
                hostname=self._state.hostname, tenant_id=tenant_id, method=method, requested=requested
            ),
        )
        self._set_record(ensured.record)
        self._state.policy = ensured.policy
        self._state.row_read_at = workflow.now()

    def _publish(self) -> None:
        """Show the state in the Temporal UI: search attributes (when the worker
        registered them) and the workflow's current details. Nothing secret.

        Called after every change of the record or the phase (``_set_record``,
        ``_enter``) and of the next wake-up. The attributes are upserted only when
        what they show changed; the first upsert of a run happens at its first
        change after the policy was read, and histories depend on that moment."""
        record = self._state.current
        if record is None:
            return
        if self._state.policy.search_attributes and not self._state.attributes_held:
            updates: list[SearchAttributeUpdate[Any]] = [
                search.STATUS.value_set(str(record.status)),
                search.ERROR_CODE.value_set(str(record.error_code))
                if record.error_code
                else search.ERROR_CODE.value_unset(),
                search.EXPIRES_AT.value_set(record.expires_at)
                if record.expires_at
                else search.EXPIRES_AT.value_unset(),
            ]
            if record.tenant_id:
                updates.append(search.TENANT.value_set(record.tenant_id))
            if self._state.policy.hostname_search_attribute:
                updates.insert(0, search.HOSTNAME.value_set(record.hostname))
            issuer = self._shown_issuer(record)
            if issuer is not None:  # never set by histories from before issuers
                updates.append(search.ISSUER.value_set(issuer))
            shown = self._shown(record)
            if shown != self._state.published:
                self._state.published = shown
                workflow.upsert_search_attributes(updates)
        details = [f"**{record.status}** — {self._state.phase}"]
        if self._state.next_attempt_at is not None:
            details.append(f"next: {self._state.next_attempt_at:%Y-%m-%d %H:%M:%S} UTC")
        if record.error_code:
            details.append(f"last error: {record.error_code}: {record.error_message or ''}")
        if record.expires_at is not None:
            details.append(f"expires: {record.expires_at:%Y-%m-%d %H:%M} UTC")
        workflow.set_current_details("\n\n".join(details))

    @staticmethod
    def _shown_at_start() -> tuple[object, ...] | None:
        """What the search attributes the run started with show (set by the
        client's start, or copied by continue-as-new), as ``_shown`` says it; None
        when the start set no status."""
        attributes = workflow.info().typed_search_attributes
        status = attributes.get(search.STATUS)
        if status is None:
            return None
        # Strings: the row's enums compare equal to their values.
        shown: tuple[object, ...] = (
            status,
            attributes.get(search.ERROR_CODE),
            attributes.get(search.EXPIRES_AT),
            attributes.get(search.TENANT),
        )
        issuer = attributes.get(search.ISSUER)
        return shown if issuer is None else (*shown, issuer)

    @staticmethod
    def _shown_issuer(record: CertificateRecord) -> str | None:
        """The CA shown: the current certificate's once ACTIVE, else the attempt's."""
        if record.status is CertificateStatus.ACTIVE:
            return record.issuer
        return record.order_issuer or record.issuer

    @classmethod
    def _shown(cls, record: CertificateRecord) -> tuple[object, ...]:
        """What the search attributes show of a record."""
        shown: tuple[object, ...] = (
            record.status, record.error_code, record.expires_at, record.tenant_id
        )
        issuer = cls._shown_issuer(record)
        return shown if issuer is None else (*shown, issuer)

    def _next_run_input(
        self, *, carry_waits: bool = False, after_issuance: bool = False
    ) -> CertificateInput:
        """After an issuance the next run starts afresh from the row just stored
        (carried with the policy: no read); in the middle of waiting it carries what
        the waits need and reads the row again."""
        record = self._record
        waits = None
        if carry_waits:
            waits = self._state.carried_waits()
        if after_issuance and (self._state.renewing_at_once or self._state.renew_next_run):
            waits = CarriedWaits(
                renewed_at_once=self._state.renewing_at_once,
                renew_requested=self._state.renew_next_run,
            )
        return CertificateInput(
            hostname=record.hostname,
            tenant_id=record.tenant_id,
            carried=record,
            waits=waits,
            policy=self._state.policy if after_issuance else None,
            # The newest design this code knows: a new run starts a new history.
            design=RUN_KEPT_AFTER_ISSUANCE_DESIGN,
        )

    @property
    def _keeps_run_after_issuance(self) -> bool:
        return (
            self._state.design >= RUN_KEPT_AFTER_ISSUANCE_DESIGN
            and workflow.info().get_current_history_length() < RUN_KEPT_BELOW_EVENTS
        )

    def _start_over_after_issuance(self) -> None:
        """Go on in this run as the run continue-as-new would start after an
        issuance: its state (the row just stored, the policy, what it carries), this
        run's design, and the search attributes showing the row."""
        design = self._state.design
        self._state = RunState.starting(self._next_run_input(after_issuance=True))
        self._state.design = design
        self._state.published = self._shown(self._state.record)

    async def _give_up(self, status: CertificateStatus, code: ErrorCode, message: str) -> bool:
        """Stop trying for the hostname: the row ``status`` with ``code`` and
        ``message`` (CANCELED ABANDONED, EXPIRED DEPARTED), a webhook named for it."""
        record = self._record
        given_up = await run(
            POSTGRES,
            RecordActivities.give_up,
            GiveUpInput(certificate_id=record.certificate_id, status=status, code=code, message=message),
        )
        if given_up.applied:
            self._set_written(
                given_up.row,
                record,
                status=status,
                error_code=code,
                error_message=message,
                order_url=None,
                challenge_url=None,
            )
            await self._notify(str(code).lower())
        return given_up.applied

    async def _withdraw_dns01(self, record: CertificateRecord) -> None:
        """Delete the hostname's dns-01 TXT from our zone, best effort: a leftover one
        goes at the next publish or withdraw at its label (certflow/dns/dns01.py)."""
        try:
            await run(
                BEST_EFFORT,
                DnsActivities.withdraw_dns01,
                Dns01ChallengeInput(certificate_id=record.certificate_id, hostname=record.hostname),
            )
        except ActivityError:
            workflow.logger.warning("could not withdraw the dns-01 TXT of %s", record.hostname)

    def _check_stop(self) -> None:
        if self._state.stop is not None:
            raise Stopped()

    async def _migrate_at_wait(self) -> None:
        """Before a durable wait: a run of a design older than the current one
        continues as new in the current design instead of waiting (the wait starts
        afresh in the next run, from the row and what the waits carry)."""
        if self._state.design < CURRENT_DESIGN and (
            self._state.migrate_requested or workflow.patched(MIGRATE_AT_WAIT_PATCH)
        ):
            await self._continue_in_current_design()

    @property
    def _migrating(self) -> bool:
        """The ``migrate`` signal came to a run of an older design: its waits end."""
        return self._state.migrate_requested and self._state.design < CURRENT_DESIGN

    async def _migrate_if_asked(self) -> None:
        """After a durable wait: the ``migrate`` signal ended it (a run whose wait
        began before the code that migrates at a wait)."""
        if self._migrating:
            await self._continue_in_current_design()

    async def _continue_in_current_design(self) -> None:
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._next_run_input(carry_waits=True))

    async def _sleep(self, seconds: float, *, interruptible: bool, migrates: bool = False) -> bool:
        """A durable wait that cancel/delete always end and, when interruptible,
        "retry now" ends too (also one sent during the attempt before it).
        Returns whether "retry now" ended it. ``migrates``: a wait the next run
        starts afresh from the row alone (a DNS recheck, FAILED), where a run of an
        older design continues as new instead (``_migrate_at_wait``); never a CA's
        Retry-After, a failure's backoff or an order's poll, which it would cut short."""
        if seconds <= 0:
            return False
        if migrates:
            await self._migrate_at_wait()
        self._state.next_attempt_at = workflow.now() + timedelta(seconds=seconds)
        self._state.retry_cuts_wait = interruptible
        self._publish()
        retried = False
        try:
            await workflow.wait_condition(
                lambda: self._state.stop is not None
                or (interruptible and self._state.retry_requested)
                or (migrates and self._migrating),
                timeout=timedelta(seconds=seconds),
                timeout_summary=f"{self._state.phase} until {self._state.next_attempt_at:%H:%M:%S} UTC",
            )
            retried = self._state.stop is None and not (migrates and self._migrating)
        except asyncio.TimeoutError:
            pass
        finally:
            self._state.next_attempt_at = None
            self._state.retry_cuts_wait = False
            if interruptible:
                self._state.retry_requested = False
        if migrates:
            await self._migrate_if_asked()
        return retried

    def _view(self) -> CertificateState:
        record = self._state.current
        if record is None:
            return CertificateState(
                hostname=self._state.hostname, status=CertificateStatus.PENDING, phase=self._state.phase
            )
        return CertificateState(
            hostname=record.hostname,
            status=record.status,
            phase=self._state.phase,
            error_code=record.error_code,
            error_message=record.error_message,
            retry_count=record.retry_count,
            next_attempt_at=self._state.next_attempt_at,
            expires_at=record.expires_at,
            issuer=record.issuer,
            order_issuer=record.order_issuer,
        )
