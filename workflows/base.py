"""What every phase of the Certificate workflow shares: the phase, durable sleeps
that signals cut short, the migration to the current design, giving up, and
what the next run is handed. The row and its writes are ``rows``'s; what the
product sees of a run (search attributes, details, webhooks) is ``publish``'s."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.dns import DnsActivities
    from activities.records import RecordActivities
    from certflow.errors import ErrorCode
    from certflow.models import CertificateRecord, CertificateStatus, Phase
    from certflow.workflow_payloads import CarriedWaits, CertificateInput, CertificateState
    from certflow.activity_payloads import Dns01ChallengeInput, GiveUpInput
    from workflows.run_state import RunState, Stopped
    from workflows.patches import (
        CURRENT_DESIGN,
        MIGRATE_AT_WAIT_PATCH,
        RUN_KEPT_AFTER_ISSUANCE_DESIGN,
        RUN_KEPT_BELOW_EVENTS,
    )
    from workflows.steps import BEST_EFFORT, POSTGRES, run

from workflows import publish, rows


class CertificateBase:
    """The state and plumbing every phase uses; the phases are mixins of it, and
    ``rows`` and ``publish`` its collaborators (functions of the run's state, which
    a run replaces whole when it goes on after an issuance)."""

    _state: RunState

    @property
    def _record(self) -> CertificateRecord:
        """The row as this run knows it (read at the start of every run)."""
        return self._state.record

    def _enter(self, phase: Phase) -> None:
        self._state.phase = phase
        publish.show(self._state)

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
            await publish.notify(self._state, "expiring_soon")

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
        self._state.published = publish.shown(self._state.record)

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
            rows.set_written(
                self._state,
                given_up.row,
                record,
                status=status,
                error_code=code,
                error_message=message,
                order_url=None,
                challenge_url=None,
            )
            await publish.notify(self._state, str(code).lower())
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
        publish.show(self._state)
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
                hostname=self._state.hostname,
                status=CertificateStatus.PENDING,
                phase=self._state.phase,
                design=self._state.design,
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
            design=self._state.design,
        )
