"""Renewing: the wait for the renewal time (the CA's ARI window or the lifetime
rule, spread per certificate), the start of a renewal, and EXPIRED when it lapses
before one succeeds."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.records import RecordActivities
    from certflow.models import CertificateStatus, Phase
    from certflow.activity_payloads import EnsureCertificateInput
    from certflow.errors import ErrorCode
    from workflows.policy import (
        NOT_READY_CODES,
        certificate_fraction,
        spread_renewal_time,
    )
    from workflows.steps import POSTGRES, run

from workflows import rows
from workflows.base import CertificateBase
from workflows.patches import AT_ONCE_AGE, HISTORY_EVENTS_BEFORE_NEW_RUN


class Renewing(CertificateBase):
    """The wait for the renewal time and the start of a renewal."""

    async def _wait_for_renewal(self) -> bool:
        """Sleep until the renewal time, or renew/stop; True when it is time to renew
        (False: the history grew long, the next run goes on waiting). One timer to
        the renewal time, spread per certificate; the CA's ARI window comes from the
        row and from the renewal-info sweep's signal."""
        record = self._record
        assert record.not_before and record.expires_at
        fraction = certificate_fraction(record.hostname, record.not_before)
        while self._state.stop is None and not self._state.renew_requested:
            window = self._record.ari_window
            renew_at = spread_renewal_time(record.not_before, record.expires_at, window, fraction)
            now = workflow.now()
            if renew_at <= now:
                # At once: the window was open when the certificate was young, or the
                # sweep's answer after a hold says now: its replacement is held if the
                # CA says the same again.
                if window is not None and (self._young(now) or self._state.ari_hold_released):
                    if self._state.renewed_at_once and not self._state.ari_hold_released:
                        await self._hold_at_once_window(fraction)
                        continue
                    workflow.logger.info(
                        "the CA's renewal window for %s is open already, an hour after"
                        " issuance or less: renewing once",
                        record.hostname,
                    )
                    self._state.renewing_at_once = True
                return True
            if workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN:
                return False
            await self._migrate_at_wait()
            self._state.window_moved = False
            self._state.next_attempt_at = renew_at
            self._enter(Phase.WAITING_FOR_RENEWAL)
            try:
                await workflow.wait_condition(
                    lambda: self._state.renew_requested or self._state.stop is not None
                    or self._state.window_moved or self._migrating,
                    timeout=renew_at - now,
                    timeout_summary=f"renewal at {renew_at:%Y-%m-%d %H:%M} UTC",
                )
            except asyncio.TimeoutError:
                pass
            self._state.next_attempt_at = None
            await self._migrate_if_asked()
        return True

    def _young(self, now: datetime) -> bool:
        """The current certificate was stored an hour ago or less."""
        issued_at = self._record.issued_at
        return issued_at is not None and now - issued_at <= AT_ONCE_AGE

    async def _hold_at_once_window(self, fraction: float) -> None:
        """A second certificate in a row whose window was open at once: the CA keeps
        telling us to renew now (an incident, or a CA bug). Renewing again would loop;
        wait for the renewal-info sweep's next answer instead (at the latest, the
        lifetime rule's renewal time)."""
        record = self._record
        assert record.not_before and record.expires_at
        workflow.logger.warning(
            "the CA's renewal window for %s opened at once again for its replacement"
            " (serial %s): waiting for the next renewal-info answer, not renewing",
            record.hostname,
            record.serial,
        )
        backstop = spread_renewal_time(record.not_before, record.expires_at, None, fraction)
        await self._migrate_at_wait()
        self._state.window_moved = False
        self._state.next_attempt_at = backstop
        self._enter(Phase.WAITING_FOR_RENEWAL_INFO)
        try:
            await workflow.wait_condition(
                lambda: self._state.renew_requested or self._state.stop is not None
                or self._state.window_moved or self._migrating,
                timeout=max(backstop - workflow.now(), timedelta(seconds=1)),
                timeout_summary="the next renewal-info answer",
            )
        except asyncio.TimeoutError:
            pass
        self._state.next_attempt_at = None
        await self._migrate_if_asked()
        self._state.ari_hold_released = True

    async def _begin_renewal(self) -> None:
        if self._state.after_issuance:
            # Months after the carried row and policy were read: read both again, so
            # settings changed since (webhooks, backoffs) apply to this renewal.
            await rows.read(self._state, self._record.tenant_id)
            if self._record.status is not CertificateStatus.ACTIVE:
                return  # the row moved on (canceled by the product): the loop decides
        record = self._record
        self._state.renew_requested = False
        self._enter(Phase.RENEWING)
        renewing = await rows.postgres(RecordActivities.begin_renewal, record.certificate_id)
        # RENEWING is shown only if the attempt waits or fails; a renewal the CA
        # grants at once shows ACTIVE next (one upsert).
        self._state.attributes_held = True
        rows.set_written(
            self._state,
            renewing.row,
            record,
            status=CertificateStatus.RENEWING if renewing.applied else record.status,
        )
        self._state.attributes_held = False
        if not renewing.applied:
            refreshed = await rows.postgres(
                RecordActivities.ensure_certificate,
                EnsureCertificateInput(hostname=record.hostname, tenant_id=record.tenant_id),
            )
            rows.set_record(self._state, refreshed.record)

    async def _expire_if_lapsed(self) -> None:
        record = self._record
        if (
            record.status is CertificateStatus.RENEWING
            and record.expires_at is not None
            and workflow.now() >= record.expires_at
        ):
            expired = await run(POSTGRES, RecordActivities.mark_expired, record.certificate_id)
            if expired.applied:
                rows.set_written(self._state, expired.row, record, status=CertificateStatus.EXPIRED)
                if record.error_code in NOT_READY_CODES:
                    # It expired while the hostname no longer routed to us: departed.
                    self._state.departed_at = workflow.now()
                    await self._give_up(
                        CertificateStatus.EXPIRED,
                        ErrorCode.DEPARTED,
                        f"departed: expired, and {record.error_message or 'no longer routed to us'}",
                    )
