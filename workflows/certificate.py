"""The Certificate workflow: one per hostname, the certificate's whole lifecycle.

PENDING → PROVISIONING → ACTIVE → (renewal time) RENEWING → ACTIVE → … until
canceled or deleted. Each issuance ends with continue-as-new, and so does every
wait once its run's history is long: no run exceeds 1,000 events, however many
years the certificate lives or waits.

Every side effect is an activity; every decision is a pure function in
:mod:`workflows.policy`. Waits are durable timers that signals and updates
(retry, renew, cancel, delete) cut short; "retry now" never bypasses a CA
rate-limit cooldown.

This file holds the loop and what the product and operators call (queries,
signals, updates); each phase is a file of its own: ``obtain`` (one attempt),
``failures`` (after a failed one), ``renew``, ``stop``; ``base`` what they
share, ``rows`` the row and its writes, ``publish`` what the product sees of a
run, ``run_state`` the run's state in one record, ``patches`` the designs,
every patch and bound.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from certflow.contract import CERTIFICATE_WORKFLOW
    from certflow.models import CertificateStatus, Phase
    from certflow.workflow_payloads import (
        CertificateInput,
        CertificateState,
        DeleteRequest,
        RenewalWindow,
        TransferRequest,
    )
    from certflow.activity_payloads import TransferInput
    from workflows.policy import RECHECK_CODES
    from workflows.run_state import RunState, Stopped, StopRequest
    from activities.dns import DnsActivities
    from workflows.steps import DNS, AttemptFailed, failure_of, run

from workflows import publish, rows
from workflows.failures import FailureHandling
from workflows.obtain import Obtaining
from workflows.patches import HISTORY_EVENTS_BEFORE_NEW_RUN, RENEW_NEXT_RUN_PATCH, design_of
from workflows.renew import Renewing
from workflows.stop import Stopping


@workflow.defn(name=CERTIFICATE_WORKFLOW)
class CertificateWorkflow(Obtaining, FailureHandling, Renewing, Stopping):
    """Issues, renews and finally cancels or deletes the certificate of one hostname."""

    @workflow.init
    def __init__(self, input: CertificateInput) -> None:
        self._state = RunState.starting(input)
        if self._state.after_issuance:
            self._state.published = publish.shown(self._state.record)

    @workflow.run
    async def run(self, input: CertificateInput) -> CertificateState:
        self._state.design = design_of(input.design)
        if self._state.published is None:
            self._state.published = publish.shown_at_start()  # no upsert repeats the start's
        # The run after an issuance starts from the row the last run stored: no read
        # until it renews (no patch: no run recorded before this carried a policy).
        if not self._state.after_issuance:
            await rows.read(self._state, input.tenant_id, input.method, input.requested)
        while True:
            record = self._record
            if self._state.stop is not None:
                return await self._finish_stop(self._state.stop)
            if record.status is CertificateStatus.CANCELED:
                return await self._end(Phase.CANCELED)
            if workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._next_run_input(carry_waits=True))
            if record.status is CertificateStatus.ACTIVE:
                if await self._wait_for_renewal() and self._state.stop is None:
                    await self._begin_renewal()
                continue
            if record.status is CertificateStatus.FAILED:
                await self._wait_failed(self._state.policy)
                if self._state.stop is None and not await self._reopen_failed():
                    return await self._end(Phase.ROW_MOVED_ON)
                continue
            await self._expire_if_lapsed()
            await self._warn_if_expiring()
            renewal = self._record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
            try:
                issued = await self._issue(self._record, self._state.policy)
            except Stopped:
                continue
            except AttemptFailed as failure:
                self._state.dns_failures = self._state.dns_failures + 1 if failure.code in RECHECK_CODES else 0
                if not await self._record_failure(failure, self._state.policy):
                    if not await self._follow_moved_row(renewal):
                        return await self._end(Phase.ROW_GONE)
                    continue
                if not await self._wait_after(failure, self._state.policy, self._state.dns_failures):
                    return await self._end(
                        Phase.ABANDONED
                        if self._record.status is CertificateStatus.CANCELED
                        else Phase.DEPARTED
                    )
                continue
            rows.set_written(
                self._state,
                issued.row,
                self._record,
                status=CertificateStatus.ACTIVE,
                error_code=None,
                error_message=None,
                retry_count=0,
                order_url=None,
                challenge_url=None,
                not_before=issued.not_before,
                expires_at=issued.not_after,
                serial=issued.serial_hex,
                # Asked by finalize_and_store; None when the CA had no answer (then
                # the sweep finds it and signals).
                ari_window_start=issued.ari_window_start,
                ari_window_end=issued.ari_window_end,
                issuer=self._state.issuer,
                issued_at=issued.issued_at,
            )
            self._enter(Phase.ISSUED)
            await publish.notify(self._state, "renewed" if renewal else "issued", serial=issued.serial_hex)
            # Answer pending updates before this run hands over to the next.
            self._state.retry_requested = self._state.renew_requested = False
            await workflow.wait_condition(workflow.all_handlers_finished)
            if self._state.stop is None:
                if self._keeps_run_after_issuance:
                    self._start_over_after_issuance()
                    continue
                workflow.continue_as_new(self._next_run_input(after_issuance=True))

    @workflow.query(name="status")
    def status(self) -> CertificateState:
        """Current status, phase, next wake-up and last error."""
        return self._view()

    @workflow.signal(name="retry")
    def retry_signal(self) -> None:
        """Retry now: cut short a DNS or failure backoff and reset a FAILED budget;
        order again from a CA whose CAA check refused. Never bypasses a CA rate-limit
        cooldown."""
        self._state.retry_requested = True
        self._state.caa_disagreements = {}

    @workflow.update(name="retry")
    async def retry_update(self) -> CertificateState:
        """Retry now; answers the state once the wait was cut short."""
        await workflow.wait_condition(lambda: self._state.current is not None)
        self._check_retry()
        self._state.retry_requested = True
        self._state.caa_disagreements = {}
        # Answer once the wait it cuts short has ended; during a step, or a wait that
        # retry does not cut (order polling), answer now: the request stays noted.
        await workflow.wait_condition(
            lambda: not self._state.retry_requested or self._state.stopped or not self._state.retry_cuts_wait
        )
        # A FAILED certificate answers once its budget is reset, not with the old state.
        await workflow.wait_condition(
            lambda: self._state.stopped
            or self._state.retry_cuts_wait
            or self._state.current is None
            or self._state.current.status is not CertificateStatus.FAILED
        )
        return self._view()

    @retry_update.validator
    def _validate_retry(self) -> None:
        self._reject_when_stopping("retry")
        if self._state.current is not None:  # else the handler decides once the row is read
            self._check_retry()

    def _check_retry(self) -> None:
        record = self._record
        if record.status in (CertificateStatus.ACTIVE, CertificateStatus.CANCELED):
            hint = "; use renew to renew it now" if record.status is CertificateStatus.ACTIVE else ""
            raise ApplicationError(
                f"nothing to retry: {record.hostname} is {record.status}{hint}", non_retryable=True
            )

    @workflow.signal(name="migrate")
    def migrate_signal(self) -> None:
        """Continue as new in the current design now, if this run's is older
        (``starter.py migrate-runs``); nothing for a run of the current design."""
        self._state.migrate_requested = True

    @workflow.signal(name="renewal_window")
    def renewal_window_signal(self, window: RenewalWindow) -> None:
        """The CA's ARI window moved (sent by the renewal-info sweep): plan again. A
        window for another certificate (the one just replaced) changes nothing."""
        if self._state.current is not None and self._state.current.serial != window.serial:
            return
        if self._state.current is not None:
            self._state.current = self._state.current.model_copy(
                update={"ari_window_start": window.start, "ari_window_end": window.end}
            )
        self._state.window_moved = True

    @workflow.signal(name="renew")
    def renew_signal(self) -> None:
        """Renew now, if the certificate is ACTIVE."""
        self._renew_when_active()

    def _renew_when_active(self) -> None:
        """Ask the loop to renew; in the ISSUED phase, where the run hands over and
        clears its requests, ask the next run instead (RENEW_NEXT_RUN_PATCH)."""
        if self._state.phase is Phase.ISSUED and workflow.patched(RENEW_NEXT_RUN_PATCH):
            self._state.renew_next_run = True
        else:
            self._state.renew_requested = True

    @workflow.update(name="renew")
    async def renew_update(self) -> CertificateState:
        """Renew now; answers once the renewal has started."""
        await workflow.wait_condition(lambda: self._state.current is not None)
        self._check_renew()
        self._state.renew_requested = True
        await workflow.wait_condition(lambda: not self._state.renew_requested or self._state.stopped)
        return self._view()

    @renew_update.validator
    def _validate_renew(self) -> None:
        self._reject_when_stopping("renew")
        if self._state.current is not None:  # else the handler decides once the row is read
            self._check_renew()

    def _check_renew(self) -> None:
        record = self._record
        if record.status is not CertificateStatus.ACTIVE:
            raise ApplicationError(
                f"nothing to renew: {record.hostname} is {record.status};"
                " only an ACTIVE certificate renews",
                non_retryable=True,
            )
        if self._state.phase is Phase.ISSUED:
            # Between the issuance and the next run (which waits for the renewal
            # time) a renew would be cleared with the run's other requests; the
            # client asks again once the next run shows (CertflowClient.renew).
            raise ApplicationError(
                f"{record.hostname} was issued a moment ago: ask again once its next run"
                " waits for the renewal time",
                non_retryable=True,
            )

    @workflow.update(name="transfer")
    async def transfer_update(self, request: TransferRequest) -> CertificateState:
        """Move the hostname to another tenant, once that tenant has proven ownership
        (its ``_certflow`` TXT, seen through the resolver); refused, nothing changes.
        Both tenants get a ``transferred`` webhook. An ACTIVE certificate is renewed at
        once, with a new key: the old tenant's certificate is served until then."""
        await workflow.wait_condition(lambda: self._state.current is not None)
        record = self._record
        try:
            moved = await run(
                DNS,
                DnsActivities.transfer_certificate,
                TransferInput(
                    certificate_id=record.certificate_id,
                    hostname=record.hostname,
                    to_tenant=request.to_tenant,
                ),
            )
        except ActivityError as err:  # refused: the caller reads why, nothing changed
            raise ApplicationError(failure_of(err).message, non_retryable=True) from None
        before = self._record.model_copy(update={"tenant_id": moved.from_tenant})
        rows.set_record(self._state, self._record.model_copy(update={"tenant_id": moved.record.tenant_id}))
        await publish.notify(self._state, "transferred", about=before)
        await publish.notify(self._state, "transferred")
        if self._record.status is CertificateStatus.ACTIVE:
            self._renew_when_active()
        return self._view()

    @transfer_update.validator
    def _validate_transfer(self, request: TransferRequest) -> None:
        self._reject_when_stopping("transfer")
        if not request.to_tenant.strip():
            raise ValueError("a transfer names the tenant to move the hostname to")

    @workflow.signal(name="cancel")
    def cancel_signal(self) -> None:
        """Stop provisioning and renewal; the status becomes CANCELED."""
        if self._state.stop is None:
            self._state.stop = StopRequest(delete=False, revoke=False)

    @workflow.update(name="cancel")
    async def cancel_update(self) -> CertificateState:
        """Cancel; answers once the certificate is CANCELED."""
        self.cancel_signal()
        await workflow.wait_condition(lambda: self._state.stopped)
        return self._view()

    @cancel_update.validator
    def _validate_cancel(self) -> None:
        self._reject_when_stopping("cancel")

    @workflow.signal(name="delete")
    def delete_signal(self, request: DeleteRequest | None = None) -> None:
        """Cancel, optionally revoke the current certificate, and remove the rows."""
        revoke = request.revoke if request is not None else False
        if self._state.stop is None or not self._state.stop.delete:
            self._state.stop = StopRequest(delete=True, revoke=revoke)

    @workflow.update(name="delete")
    async def delete_update(self, request: DeleteRequest | None = None) -> CertificateState:
        """Delete; answers once the rows are gone (or the revocation failed)."""
        self.delete_signal(request)
        await workflow.wait_condition(lambda: self._state.stopped)
        return self._view()

    @delete_update.validator
    def _validate_delete(self, request: DeleteRequest | None = None) -> None:
        if self._state.stop is not None and self._state.stop.delete:
            raise ValueError(f"{self._state.hostname} is already being deleted")

    def _reject_when_stopping(self, action: str) -> None:
        if self._state.stop is not None or self._state.stopped:
            raise ValueError(f"cannot {action}: {self._state.hostname} is canceled")
