"""After a failed attempt: the outcome recorded (docs/lifecycle.md, "Statuses and errors"), a fallback to the next CA
when this one cannot issue, and the wait before the next attempt — DNS re-checks,
backoffs, a rate-limit cooldown, or FAILED until retry."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.acme import AcmeActivities
    from activities.records import RecordActivities
    from certflow.errors import ErrorCode
    from certflow.models import CertificateStatus, Phase, ValidationMethod
    from certflow.workflow_payloads import CaaDisagreement, ProvisioningPolicy
    from certflow.activity_payloads import Outcome, RecordFailureInput
    from workflows.policy import (
        NOT_READY_CODES,
        DNS_CODES,
        RECHECK_CODES,
        cooldown_spread,
        decide_outcome,
        dns_recheck_delay,
        failure_backoff,
        fallback_issuers,
        fallback_outcome,
        retries_automatically,
    )
    from workflows.steps import (
        POSTGRES,
        AttemptFailed,
        run,
    )

from workflows import publish, rows
from workflows.base import CertificateBase
from workflows.patches import HISTORY_EVENTS_BEFORE_NEW_RUN, LOST_WORKER_PATCH


class FailureHandling(CertificateBase):
    """What follows a failed attempt (``_record_failure``, then ``_wait_after``)."""

    async def _record_failure(self, failure: AttemptFailed, policy: ProvisioningPolicy) -> bool:
        record = self._record
        if failure.code is ErrorCode.ACME_CAA and self._state.issuer is not None:
            self._state.caa_disagreements[self._state.issuer] = CaaDisagreement(
                reading=self._state.caa_reading, detail=failure.message[:300]
            )
        outcome = decide_outcome(
            record.status,
            record.retry_count,
            record.order_url is not None,
            failure.code,
            policy.max_failures,
            charged=not (failure.lost and workflow.patched(LOST_WORKER_PATCH)),
        )
        if self._state.departed_at is not None and failure.code in NOT_READY_CODES:
            # Still gone: the row keeps saying so (DEPARTED) while it re-checks.
            outcome = outcome.model_copy(update={"error_code": ErrorCode.DEPARTED})
        reason = self._fallback_reason(failure, outcome, policy)
        if reason is not None and self._fall_back(reason):
            outcome = fallback_outcome(record.status, failure.code)
        elif outcome.status is CertificateStatus.FAILED:
            self._state.passed_over = {}  # spent everywhere: the next attempt starts a new round
        recorded = await run(
            POSTGRES,
            RecordActivities.record_failure,
            RecordFailureInput(
                certificate_id=record.certificate_id, outcome=outcome, message=failure.message
            ),
        )
        applied, keep = recorded.applied, outcome.keep_order
        rows.set_written(
            self._state,
            recorded.row,
            record,
            status=outcome.status,
            retry_count=outcome.retry_count,
            error_code=outcome.error_code,
            error_message=failure.message,
            order_url=record.order_url if keep else None,
            challenge_url=record.challenge_url if keep else None,
        )
        if applied and not keep and record.validation_method is ValidationMethod.DNS_01:
            await self._withdraw_dns01(record)  # the order is abandoned: its TXT goes too
        if applied and outcome.status is CertificateStatus.FAILED:
            await publish.notify(self._state, "failed")
        elif (
            applied
            and failure.code in NOT_READY_CODES
            and outcome.error_code is not record.error_code  # once per reason, not per re-check
        ):
            await publish.notify(self._state, "not_ready")
        return applied

    def _fallback_reason(
        self, failure: AttemptFailed, outcome: Outcome, policy: ProvisioningPolicy
    ) -> str | None:
        """Why the attempt's issuer cannot issue now, when it is a reason to try the
        next one: a long cooldown, the failure budget spent, or no answer for long
        (since when it has not answered is kept here, failure after failure)."""
        issuer, now = self._state.issuer, workflow.now()
        if issuer is None:
            return None
        if not failure.unreachable:
            self._state.unreachable_since = None
        elif self._state.unreachable_since is None:
            self._state.unreachable_since = now
        detail = failure.message[:300]
        if failure.code is ErrorCode.ACME_RATE_LIMITED:
            seconds = failure.retry_after or 0.0
            if seconds > policy.issuer_fallback_cooldown_seconds:
                until = now + timedelta(seconds=seconds)
                return f"{issuer}, rate-limited until {until:%Y-%m-%d %H:%M} UTC: {detail}"
        if self._state.unreachable_since is not None:
            down = (now - self._state.unreachable_since).total_seconds()
            if down >= policy.issuer_fallback_unreachable_seconds:
                return f"{issuer}, unreachable since {self._state.unreachable_since:%Y-%m-%d %H:%M} UTC"
        if outcome.status is CertificateStatus.FAILED:
            return f"{issuer}, {failure.code} after {outcome.retry_count} attempts: {detail}"
        return None

    def _fall_back(self, reason: str) -> bool:
        """Pass over the attempt's issuer (the next attempt goes, at once, to the next
        one CAA allows) when there is another; False when there is none."""
        if self._state.issuer is None or not fallback_issuers(
            self._state.allowed, self._state.issuer, self._state.passed_over
        ):
            return False
        self._state.passed_over = {**self._state.passed_over, self._state.issuer: reason}
        self._state.unreachable_since = None
        self._state.fell_back = True
        return True

    async def _follow_moved_row(self, renewal: bool) -> bool:
        """The row left the attempt's status without this run, most often because an
        earlier try of finalize_and_store stored the certificate and its result was
        lost: carry on from the row as it is. False when it was deleted."""
        record = self._record
        try:
            reread = await run(POSTGRES, RecordActivities.reload_record, record.certificate_id)
        except ActivityError:
            return False
        rows.set_record(self._state, reread)
        if reread.status is CertificateStatus.ACTIVE:
            self._enter(Phase.ISSUED)
            await publish.notify(self._state, "renewed" if renewal else "issued")
        return True

    async def _wait_after(
        self, failure: AttemptFailed, policy: ProvisioningPolicy, dns_failures: int
    ) -> bool:
        """Wait before the next attempt; False when there is none to make: abandoned
        (ABANDONED: CANCELED) or departed past its retention (DEPARTED)."""
        if await self._given_up(failure, policy):
            return False
        await self._wait_before_next(failure, policy, dns_failures)
        return True

    async def _given_up(self, failure: AttemptFailed, policy: ProvisioningPolicy) -> bool:
        """A hostname that was never issued and has had no validation method ready for
        ``pending_timeout_days`` is CANCELED (ABANDONED); one that expired no longer
        routed to us stops ``departed_retention_days`` after it expired."""
        record, now = self._record, workflow.now()
        if failure.code not in NOT_READY_CODES:
            self._state.pending_since = None
            return False
        if record.status is CertificateStatus.PENDING and record.serial is None:
            since = self._state.pending_since = self._state.pending_since or now
            days = policy.pending_timeout_days
            if days > 0 and now - since >= timedelta(days=days):
                await self._give_up(
                    CertificateStatus.CANCELED,
                    ErrorCode.ABANDONED,
                    f"abandoned: no validation method was ready for {days:g} days ({failure.message})",
                )
                return True
        departed = self._state.departed_at
        if record.status is CertificateStatus.EXPIRED and departed is None:
            # Expired, and still not routed to us (asked again, or since before this
            # run): departed from now.
            departed = self._state.departed_at = now
        if record.status is CertificateStatus.EXPIRED and departed is not None:
            days = policy.departed_retention_days
            if days > 0 and now - departed >= timedelta(days=days):
                return True
        return False

    async def _wait_before_next(
        self, failure: AttemptFailed, policy: ProvisioningPolicy, dns_failures: int
    ) -> None:
        record = self._record
        if self._state.fell_back:
            self._state.fell_back = False
            return  # the next issuer is tried at once
        if record.status is CertificateStatus.FAILED:
            return
        if failure.code is ErrorCode.ACME_RATE_LIMITED:
            self._enter(Phase.WAITING_FOR_RATE_LIMIT)
            # Retry-After 0 means "now", but a CA repeating it must not spin us.
            seconds = max(failure.retry_after or 0.0, 1.0)
            seconds += cooldown_spread(seconds, workflow.random().random())
            await self._wait_for_cooldown(self._capped(seconds))
            return
        if failure.code in RECHECK_CODES:
            if failure.code in DNS_CODES:
                self._enter(Phase.WAITING_FOR_DNS)
            elif failure.code is ErrorCode.HTTP01_UNREACHABLE:
                self._enter(Phase.WAITING_FOR_HTTP01)
            else:
                self._enter(Phase.WAITING_FOR_DNS01)
            delay = dns_recheck_delay(dns_failures, policy)
        else:
            self._enter(Phase.WAITING_BEFORE_RETRY)
            delay = failure_backoff(record.retry_count, policy)
        # A recheck starts afresh in a next run; a backoff must be waited out here.
        await self._sleep(self._capped(delay), interruptible=True, migrates=failure.code in RECHECK_CODES)

    def _capped(self, delay: float) -> float:
        """During a renewal, wake when the old certificate lapses (to show EXPIRED on
        time) and when it starts expiring soon (to tell the product)."""
        record = self._record
        if record.status is CertificateStatus.RENEWING and record.expires_at is not None:
            for moment in (record.expires_at, self._expiring_soon_at()):
                if moment is not None and moment > workflow.now():
                    delay = min(delay, (moment - workflow.now()).total_seconds() + 1.0)
        return delay

    async def _wait_for_cooldown(self, seconds: float) -> None:
        """Sleep out a CA rate limit. "retry now" (which clearing a cooldown sends)
        only makes the workflow look at the cooldowns that apply to it again: it
        never goes on while one is in force."""
        record = self._record
        while await self._sleep(seconds, interruptible=True):
            seconds = await run(POSTGRES, AcmeActivities.cooldown_remaining, record.hostname)
            if seconds <= 0:
                return
            if workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN:
                return  # retried again and again: the main loop continues as new

    async def _wait_failed(self, policy: ProvisioningPolicy) -> None:
        self._enter(Phase.FAILED_WAITING)
        automatic = retries_automatically(self._record.error_code)
        if policy.failed_retry_seconds > 0 and automatic:
            await self._sleep(policy.failed_retry_seconds, interruptible=True, migrates=True)
        else:
            await self._migrate_at_wait()
            self._state.next_attempt_at = None
            self._state.retry_cuts_wait = True
            await workflow.wait_condition(
                lambda: self._state.retry_requested or self._state.stop is not None or self._migrating
            )
            self._state.retry_cuts_wait = False
            self._state.retry_requested = False
            await self._migrate_if_asked()

    async def _reopen_failed(self) -> bool:
        record = self._record
        try:
            reopened = await run(POSTGRES, RecordActivities.reopen_failed, record.certificate_id)
        except ActivityError:
            return False  # the row is gone
        rows.set_record(self._state, reopened)
        return reopened.status is not CertificateStatus.FAILED
