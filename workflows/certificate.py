"""The Certificate workflow: one per hostname, the certificate's whole lifecycle.

PENDING → PROVISIONING → ACTIVE → (renewal time) RENEWING → ACTIVE → … until
canceled or deleted. Each issuance ends with continue-as-new, and so does every
wait once its run's history is long: no run exceeds 1,000 events, however many
years the certificate lives or waits.

Every side effect is an activity; every decision is a pure function in
:mod:`workflows.policy`. Waits are durable timers that signals and updates
(retry, renew, cancel, delete) cut short; "retry now" never bypasses a CA
rate-limit cooldown.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.acme import AcmeActivities
    from activities.dns import DnsActivities
    from activities.preflight import PreflightActivities
    from activities.records import RecordActivities
    from certflow import search
    from certflow.contract import (
        CERTIFICATE_WORKFLOW,
        WEBHOOK_DELIVERY_WORKFLOW,
        webhook_workflow_id,
    )
    from certflow.errors import ErrorCode
    from certflow.issuers import DEFAULT_ISSUER
    from certflow.models import (
        ISSUABLE,
        AcceptChallengeInput,
        CaaDisagreement,
        CarriedWaits,
        CertificateInput,
        CertificateRecord,
        CertificateState,
        CertificateStatus,
        CheckDnsInput,
        CreateOrderInput,
        DeleteRequest,
        DnsVerdict,
        EnsureCertificateInput,
        FinalizeInput,
        Http01CheckInput,
        IssuedCertificate,
        OpenedOrder,
        Outcome,
        PersistChallengeInput,
        OrderKind,
        Phase,
        PlaceOrderInput,
        ProvisioningPolicy,
        RecordFailureInput,
        RenewalAdvice,
        RenewalWindow,
        WaitForOrderInput,
        WebhookEvent,
    )
    from workflows.policy import (
        DNS_CODES,
        RECHECK_CODES,
        retries_automatically,
        certificate_fraction,
        choose_issuer,
        cooldown_spread,
        decide_outcome,
        dns_recheck_delay,
        failure_backoff,
        fallback_issuers,
        fallback_outcome,
        issuer_reason,
        order_poll_delay,
        renewal_time,
        spread_renewal_time,
    )
    from workflows.steps import (
        BEST_EFFORT,
        CA,
        DNS,
        FINALIZE,
        POSTGRES,
        AttemptFailed,
        failure_of,
        order_wait,
        run,
    )

# Patches (workflow.patched): each keeps the histories of older runs replaying.
FOLLOW_MOVED_ROW_PATCH = "follow-moved-row"
"""A failure that finds the row moved on re-reads the row instead of ending the workflow."""
PLACE_ORDER_PATCH = "place-order"
"""One place_order activity (create + persist) instead of create_order and
persist_challenge, and the accept inside the first wait_for_order instead of
accept_challenge: two round trips fewer per certificate."""
RENEWAL_INFO_SWEEP_PATCH = "renewal-info-sweep"
"""An ACTIVE certificate sleeps to its renewal time, spread per certificate (jitter
without ARI; an ARI window that runs to notAfter cut to leave room for failures),
its ARI window kept current by the renewal-info sweep's signal, instead of asking
the CA itself on every re-check."""
BOUNDED_HISTORY_PATCH = "bounded-history"
"""A run whose history grew past HISTORY_EVENTS_BEFORE_NEW_RUN continues as new at
the next turn of its loop, carrying what its waits need: a certificate waiting
for years for DNS, a failure budget or a cooldown never reaches Temporal's limit."""
HISTORY_EVENTS_BEFORE_NEW_RUN = 500
"""With one turn of the loop at most ~60 events, no run exceeds 1,000 events."""
COOLDOWN_SPREAD_PATCH = "cooldown-spread"
"""Waiting workflows resume spread out when a rate-limit cooldown ends, not all at once."""
HTTP01_SELF_CHECK_PATCH = "http01-self-check"
"""The persisted challenge is fetched as the CA would fetch it before it is accepted."""
BOUNDED_COOLDOWN_WAIT_PATCH = "bounded-cooldown-wait"
"""A cooldown wait that ``retry`` keeps cutting short goes back to the main loop (which
continues as new) once the run is long, instead of waiting on in the same run."""
BOUNDED_ORDER_POLL_PATCH = "bounded-order-poll"
"""Polling an order the CA keeps pending continues as new past
HISTORY_EVENTS_BEFORE_NEW_RUN events too, the open order on the row."""
ARI_ONCE_PER_WINDOW_PATCH = "ari-once-per-window"
"""A certificate an hour old or less whose ARI window is already open renews once; its
replacement, given such a window again, waits for the sweep's next answer."""
AT_ONCE_AGE = timedelta(hours=1)


class _Stopped(Exception):
    """Cancel or delete was requested while an attempt ran."""


@workflow.defn(name=CERTIFICATE_WORKFLOW)
class CertificateWorkflow:
    """Issues, renews and finally cancels or deletes the certificate of one hostname."""

    @workflow.init
    def __init__(self, input: CertificateInput) -> None:
        self._hostname = input.hostname
        # Carried over a continue-as-new, so queries and updates are answered
        # right away in the new run, before the row is read again.
        self._current: CertificateRecord | None = input.carried
        self._phase = Phase.STARTING
        self._next_attempt_at: datetime | None = None
        self._renew_requested = False
        self._stop: _StopRequest | None = None
        self._stopped = False
        self._policy = ProvisioningPolicy()
        self._retry_cuts_wait = False
        self._published: tuple[object, ...] | None = None
        waits = input.waits or CarriedWaits()
        self._retry_requested = waits.retry_requested
        self._renewed_at_once = waits.renewed_at_once
        """The certificate waited on replaced one that renewed at once for an ARI
        window already open when it was young (CarriedWaits.renewed_at_once)."""
        self._renewing_at_once = False
        """The renewal under way is such a renewal."""
        self._ari_hold_released = False
        """The renewal-info sweep answered since a second at-once window was held."""
        self._warned_expiring = waits.warned_expiring
        self._dns_failures = waits.dns_failures
        # The issuer (CA) of the attempt: chosen from those CAA allows, falling back
        # from one that cannot issue (histories from before issuers: None throughout).
        self._issuer: str | None = None
        self._issuer_reason: str | None = None
        self._allowed: list[str] = []
        self._passed_over: dict[str, str] = dict(waits.passed_over)
        self._unreachable_since: datetime | None = waits.unreachable_since
        self._caa_disagreements: dict[str, CaaDisagreement] = dict(waits.caa_disagreements)
        """CAs whose own CAA check refused although ours allowed, with our reading then."""
        self._caa_reading: str | None = None
        """The attempt's reading of the deciding CAA set (None: not read this attempt)."""
        self._accepted_challenge: str | None = waits.accepted_challenge
        """The challenge the CA answered an accept for: never POSTed again."""
        self._fell_back = False
        self._window_moved = False
        self._after_issuance = False
        """This run follows an issuance: started by code that has every patch, and with
        the search attributes of the carried row (continue-as-new copies them)."""
        if input.carried is not None and input.policy is not None:
            self._after_issuance = True
            self._policy = input.policy
            self._published = self._shown(input.carried)

    @property
    def _record(self) -> CertificateRecord:
        """The row as this run knows it (read at the start of every run)."""
        assert self._current is not None
        return self._current

    def _set_record(self, record: CertificateRecord) -> None:
        self._current = record
        self._publish()

    def _enter(self, phase: Phase) -> None:
        self._phase = phase
        self._publish()

    # -- the lifecycle -----------------------------------------------------------

    @workflow.run
    async def run(self, input: CertificateInput) -> CertificateState:
        # The run after an issuance starts from the row the last run stored: no read
        # until it renews (no patch: no run recorded before this carried a policy).
        if not self._after_issuance:
            await self._read_row(input.tenant_id)
        while True:
            record = self._record
            if self._stop is not None:
                return await self._finish_stop(self._stop)
            if record.status is CertificateStatus.CANCELED:
                return await self._end(Phase.CANCELED)
            if (
                workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN
                and workflow.patched(BOUNDED_HISTORY_PATCH)
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._next_run_input(carry_waits=True))
            if record.status is CertificateStatus.ACTIVE:
                if await self._wait_for_renewal() and self._stop is None:
                    await self._begin_renewal()
                continue
            if record.status is CertificateStatus.FAILED:
                await self._wait_failed(self._policy)
                if self._stop is None and not await self._reopen_failed():
                    return await self._end(Phase.ROW_MOVED_ON)
                continue
            await self._expire_if_lapsed()
            await self._warn_if_expiring()
            renewal = self._record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
            try:
                issued = await self._issue(self._record, self._policy)
            except _Stopped:
                continue
            except AttemptFailed as failure:
                self._dns_failures = self._dns_failures + 1 if failure.code in RECHECK_CODES else 0
                if not await self._record_failure(failure, self._policy):
                    if not workflow.patched(FOLLOW_MOVED_ROW_PATCH):
                        return await self._end(Phase.ROW_MOVED_ON)
                    if not await self._follow_moved_row(renewal):
                        return await self._end(Phase.ROW_GONE)
                    continue
                await self._wait_after(failure, self._policy, self._dns_failures)
                continue
            self._set_record(self._record.model_copy(
                update={
                    "status": CertificateStatus.ACTIVE,
                    "error_code": None,
                    "error_message": None,
                    "retry_count": 0,
                    "order_url": None,
                    "challenge_url": None,
                    "not_before": issued.not_before,
                    "expires_at": issued.not_after,
                    "serial": issued.serial_hex,
                    # Asked by finalize_and_store; None when the CA had no answer (then
                    # the sweep finds it and signals).
                    "ari_window_start": issued.ari_window_start,
                    "ari_window_end": issued.ari_window_end,
                    "issuer": self._issuer,
                    "issued_at": issued.issued_at,
                }
            ))
            self._enter(Phase.ISSUED)
            await self._notify("renewed" if renewal else "issued", serial=issued.serial_hex)
            # Answer pending updates before this run hands over to the next.
            self._retry_requested = self._renew_requested = False
            await workflow.wait_condition(workflow.all_handlers_finished)
            if self._stop is None:
                workflow.continue_as_new(self._next_run_input(after_issuance=True))

    async def _issue(self, record: CertificateRecord, policy: ProvisioningPolicy) -> IssuedCertificate:
        """One attempt: DNS, order, challenge, wait, finalize and store."""
        try:
            order_url, challenge_url = record.order_url, record.challenge_url
            accept_first = accept_unsure = False
            self_check = False
            self._caa_reading = None
            if order_url is None:
                allowed = list(policy.issuers)  # a managed hostname: no CAA to ask
                if not record.skips_dns:
                    self._enter(Phase.CHECKING_DNS)
                    verdict: DnsVerdict | None = await run(
                        DNS, DnsActivities.check_dns, CheckDnsInput(hostname=record.hostname)
                    )
                    if verdict is not None:  # None in histories from before issuers
                        allowed = verdict.allowed_issuers
                        self._caa_reading = verdict.caa_reading
                    self._check_stop()
                if self._caa_disagreements:
                    allowed = self._not_disagreeing(allowed)
                self._choose_issuer(record, allowed, policy)
                self._enter(Phase.CREATING_ORDER)
                accept_first = workflow.patched(PLACE_ORDER_PATCH)
                if accept_first:
                    order = await run(
                        CA,
                        AcmeActivities.place_order,
                        PlaceOrderInput(
                            certificate_id=record.certificate_id,
                            hostname=record.hostname,
                            kind=self._order_kind(record),
                            issuer=self._issuer,
                            issuer_reason=self._issuer_reason,
                        ),
                    )
                else:
                    order = await self._create_and_persist_order(record)
                order_url, challenge_url = order.order_url, order.challenge_url
                renewal = record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
                record = record.model_copy(
                    update={
                        "order_url": order_url,
                        "challenge_url": challenge_url,
                        "status": record.status if renewal else CertificateStatus.PROVISIONING,
                        "error_code": None,
                        "error_message": None,
                        "order_issuer": self._issuer,
                    }
                )
                self._set_record(record)
                self._check_stop()
                self_check = accept_first
                if not accept_first:
                    self._enter(Phase.ACCEPTING_CHALLENGE)
                    await run(
                        CA,
                        AcmeActivities.accept_challenge,
                        AcceptChallengeInput(challenge_url=challenge_url, issuer=self._issuer),
                    )
            else:
                self._issuer = record.order_issuer  # the kept order's CA
                if record.error_code is ErrorCode.HTTP01_UNREACHABLE:
                    self_check = accept_first = True  # kept when its self-check failed: never accepted
                elif challenge_url is not None and challenge_url != self._accepted_challenge:
                    # The accept may have failed unanswered (or been answered before this
                    # run): the activity reads the challenge and POSTs only if pending.
                    accept_first = accept_unsure = True
            if (
                self_check
                and policy.http01_self_check
                and workflow.patched(HTTP01_SELF_CHECK_PATCH)
            ):
                self._enter(Phase.CHECKING_HTTP01)
                await run(
                    DNS,
                    PreflightActivities.check_http01,
                    Http01CheckInput(certificate_id=record.certificate_id, hostname=record.hostname),
                )
                self._check_stop()
            await self._wait_for_order(order_url, challenge_url, policy, accept_first, accept_unsure)
            self._check_stop()  # a cancel during polling must not issue a certificate
            self._enter(Phase.FINALIZING)
            return await run(
                FINALIZE,
                AcmeActivities.finalize_and_store,
                FinalizeInput(
                    certificate_id=record.certificate_id,
                    hostname=record.hostname,
                    order_url=order_url,
                    issuer=self._issuer,
                ),
            )
        except ActivityError as err:
            if self._stop is not None:
                raise _Stopped() from None
            failure = failure_of(err)
            if failure.accepted:
                self._accepted_challenge = record.challenge_url or self._record.challenge_url
            raise failure from None

    def _choose_issuer(
        self, record: CertificateRecord, allowed: list[str], policy: ProvisioningPolicy
    ) -> None:
        """The attempt's issuer: the first CAA allows that was not fallen back from; a
        renewal prefers the CA of its certificate (``replaces`` only applies there)."""
        renewal = record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
        preferred = self._named(record.issuer) if renewal else None
        if allowed and all(name in self._passed_over for name in allowed):
            self._passed_over = {}  # every allowed CA was passed over: a new round
        self._allowed = allowed
        self._issuer = choose_issuer(allowed, preferred, self._passed_over)
        self._issuer_reason = issuer_reason(
            self._issuer, policy.issuers, allowed, self._passed_over, preferred
        )

    def _not_disagreeing(self, allowed: list[str]) -> list[str]:
        """The allowed issuers less those whose own CAA check refused this hostname
        while our reading has not changed since (a CA refused on its reading: ordering
        there again only spends a failed authorization). AttemptFailed DNS_CAA when
        that leaves none."""
        reading = self._caa_reading
        kept = []
        for name in allowed:
            disagreement = self._caa_disagreements.get(name)
            if disagreement is None:
                kept.append(name)
            elif disagreement.reading is None:
                # Not read when the CA refused: this reading is the one to change from.
                self._caa_disagreements[name] = disagreement.model_copy(update={"reading": reading})
            elif disagreement.reading != reading:
                del self._caa_disagreements[name]  # the answer changed: try it again
                kept.append(name)
        if kept or not allowed:
            return kept
        name = allowed[0]
        held = self._caa_disagreements[name]
        ca = "the CA" if name == DEFAULT_ISSUER else f"the CA {name}"
        raise AttemptFailed(
            ErrorCode.DNS_CAA,
            f"{ca} refused on CAA although our check allows it ({held.detail}); we read"
            f" {held.reading or 'nothing'}. No new order goes to {ca} until that reading"
            " changes, or retry.",
            None,
        )

    def _named(self, issuer: str | None) -> str | None:
        """An issuer as rows name it: None is the first configured."""
        if issuer is None and self._policy.issuers:
            return self._policy.issuers[0]
        return issuer

    def _order_kind(self, record: CertificateRecord) -> OrderKind:
        """How the CA counts this order: a renewal of the certificate in place is
        exempt from some limits, an ARI renewal from nearly all (SPEC §4); at another
        CA than the certificate's it is a new order there."""
        if record.status not in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED):
            return OrderKind.NEW
        if self._issuer is not None and self._named(record.issuer) != self._issuer:
            return OrderKind.NEW
        # Boulder's SuggestedWindow.IsWithin: start <= now < end, at the order itself.
        window = record.ari_window
        in_window = window is not None and window[0] <= workflow.now() < window[1]
        return OrderKind.ARI_RENEWAL if in_window else OrderKind.RENEWAL

    async def _create_and_persist_order(self, record: CertificateRecord) -> OpenedOrder:
        """How runs from before PLACE_ORDER_PATCH open an order: two activities."""
        order = await run(CA, AcmeActivities.create_order, CreateOrderInput(hostname=record.hostname))
        persisted = await run(
            POSTGRES,
            RecordActivities.persist_challenge,
            PersistChallengeInput(certificate_id=record.certificate_id, order=order),
        )
        if not persisted:
            raise AttemptFailed(ErrorCode.ACME_INVALID_ORDER, "the certificate row moved on", None)
        return order

    async def _wait_for_order(
        self,
        order_url: str,
        challenge_url: str | None,
        policy: ProvisioningPolicy,
        accept_first: bool = False,
        accept_unsure: bool = False,
    ) -> None:
        """Poll fast inside an activity (accepting the challenge first when asked),
        then on durable timers that back off. The challenge is POSTed at most once:
        never again once the CA answered (SPEC §3 step 5)."""
        attempt = 0
        while True:
            self._check_stop()
            self._enter(Phase.POLLING_ORDER)
            accepting = accept_first and attempt == 0
            progress = await run(
                order_wait(policy.order_fast_poll_seconds),
                AcmeActivities.wait_for_order,
                WaitForOrderInput(
                    order_url=order_url,
                    challenge_url=challenge_url,
                    within_seconds=policy.order_fast_poll_seconds,
                    accept_first=accepting,
                    issuer=self._issuer,
                    accept_unsure=accepting and accept_unsure,
                ),
            )
            if accepting:
                self._accepted_challenge = challenge_url
            if progress.status in ISSUABLE:
                return
            delay = order_poll_delay(attempt, progress.retry_after_seconds)
            attempt += 1
            self._enter(Phase.polling_again(progress.status))
            # The CA's pacing (Retry-After) is honoured even against "retry now".
            await self._sleep(delay, interruptible=False)
            if (
                workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN
                and self._stop is None
                and workflow.patched(BOUNDED_ORDER_POLL_PATCH)
            ):
                # An order the CA keeps pending for days (an incident): the next run
                # goes on polling it from the row, never accepting it again.
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._next_run_input(carry_waits=True))

    async def _record_failure(self, failure: AttemptFailed, policy: ProvisioningPolicy) -> bool:
        record = self._record
        if failure.code is ErrorCode.ACME_CAA and self._issuer is not None:
            self._caa_disagreements[self._issuer] = CaaDisagreement(
                reading=self._caa_reading, detail=failure.message[:300]
            )
        outcome = decide_outcome(
            record.status,
            record.retry_count,
            record.order_url is not None,
            failure.code,
            policy.max_failures,
        )
        reason = self._fallback_reason(failure, outcome, policy)
        if reason is not None and self._fall_back(reason):
            outcome = fallback_outcome(record.status, failure.code)
        elif outcome.status is CertificateStatus.FAILED:
            self._passed_over = {}  # spent everywhere: the next attempt starts a new round
        applied = await run(
            POSTGRES,
            RecordActivities.record_failure,
            RecordFailureInput(
                certificate_id=record.certificate_id, outcome=outcome, message=failure.message
            ),
        )
        keep = outcome.keep_order
        self._set_record(record.model_copy(
            update={
                "status": outcome.status,
                "retry_count": outcome.retry_count,
                "error_code": outcome.error_code,
                "error_message": failure.message,
                "order_url": record.order_url if keep else None,
                "challenge_url": record.challenge_url if keep else None,
            }
        ))
        if applied and outcome.status is CertificateStatus.FAILED:
            await self._notify("failed")
        return applied

    def _fallback_reason(
        self, failure: AttemptFailed, outcome: Outcome, policy: ProvisioningPolicy
    ) -> str | None:
        """Why the attempt's issuer cannot issue now, when it is a reason to try the
        next one: a long cooldown, the failure budget spent, or no answer for long
        (since when it has not answered is kept here, failure after failure)."""
        issuer, now = self._issuer, workflow.now()
        if issuer is None:
            return None
        if not failure.unreachable:
            self._unreachable_since = None
        elif self._unreachable_since is None:
            self._unreachable_since = now
        detail = failure.message[:300]
        if failure.code is ErrorCode.ACME_RATE_LIMITED:
            seconds = failure.retry_after or 0.0
            if seconds > policy.issuer_fallback_cooldown_seconds:
                until = now + timedelta(seconds=seconds)
                return f"{issuer}, rate-limited until {until:%Y-%m-%d %H:%M} UTC: {detail}"
        if self._unreachable_since is not None:
            down = (now - self._unreachable_since).total_seconds()
            if down >= policy.issuer_fallback_unreachable_seconds:
                return f"{issuer}, unreachable since {self._unreachable_since:%Y-%m-%d %H:%M} UTC"
        if outcome.status is CertificateStatus.FAILED:
            return f"{issuer}, {failure.code} after {outcome.retry_count} attempts: {detail}"
        return None

    def _fall_back(self, reason: str) -> bool:
        """Pass over the attempt's issuer (the next attempt goes, at once, to the next
        one CAA allows) when there is another; False when there is none."""
        if self._issuer is None or not fallback_issuers(
            self._allowed, self._issuer, self._passed_over
        ):
            return False
        self._passed_over = {**self._passed_over, self._issuer: reason}
        self._unreachable_since = None
        self._fell_back = True
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
        self._set_record(reread)
        if reread.status is CertificateStatus.ACTIVE:
            self._enter(Phase.ISSUED)
            await self._notify("renewed" if renewal else "issued")
        return True

    async def _wait_after(
        self, failure: AttemptFailed, policy: ProvisioningPolicy, dns_failures: int
    ) -> None:
        record = self._record
        if self._fell_back:
            self._fell_back = False
            return  # the next issuer is tried at once
        if record.status is CertificateStatus.FAILED:
            return
        if failure.code is ErrorCode.ACME_RATE_LIMITED:
            self._enter(Phase.WAITING_FOR_RATE_LIMIT)
            # Retry-After 0 means "now", but a CA repeating it must not spin us.
            seconds = max(failure.retry_after or 0.0, 1.0)
            if workflow.patched(COOLDOWN_SPREAD_PATCH):
                seconds += cooldown_spread(seconds, workflow.random().random())
            await self._wait_for_cooldown(self._capped(seconds))
            return
        if failure.code in RECHECK_CODES:
            dns = failure.code in DNS_CODES
            self._enter(Phase.WAITING_FOR_DNS if dns else Phase.WAITING_FOR_HTTP01)
            delay = dns_recheck_delay(dns_failures, policy)
        else:
            self._enter(Phase.WAITING_BEFORE_RETRY)
            delay = failure_backoff(record.retry_count, policy)
        await self._sleep(self._capped(delay), interruptible=True)

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
            if (
                workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN
                and workflow.patched(BOUNDED_COOLDOWN_WAIT_PATCH)
            ):
                return  # retried again and again: the main loop continues as new


    def _expiring_soon_at(self) -> datetime | None:
        record = self._record
        if self._warned_expiring or record is None or record.expires_at is None:
            return None
        return record.expires_at - timedelta(days=self._policy.expiring_soon_days)

    async def _warn_if_expiring(self) -> None:
        """An 'expiring_soon' event once a renewal has not succeeded by then."""
        moment = self._expiring_soon_at()
        record = self._record
        renewing = record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
        if moment is not None and renewing and workflow.now() >= moment:
            self._warned_expiring = True
            await self._notify("expiring_soon")

    async def _notify(self, event: str, serial: str | None = None) -> None:
        """Hand the event to a WebhookDelivery child that retries on its own and
        outlives this run (continue-as-new, cancel)."""
        record = self._record
        if not self._policy.webhooks or record is None:
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
                issuer=self._issuer or record.issuer,
                issuer_reason=self._issuer_reason,
            ),
            id=webhook_workflow_id(record.hostname, event_id),
            parent_close_policy=ParentClosePolicy.ABANDON,
        )

    async def _wait_failed(self, policy: ProvisioningPolicy) -> None:
        self._enter(Phase.FAILED_WAITING)
        automatic = retries_automatically(self._record.error_code)
        if policy.failed_retry_seconds > 0 and automatic:
            await self._sleep(policy.failed_retry_seconds, interruptible=True)
        else:
            self._next_attempt_at = None
            self._retry_cuts_wait = True
            await workflow.wait_condition(
                lambda: self._retry_requested or self._stop is not None
            )
            self._retry_cuts_wait = False
            self._retry_requested = False

    async def _reopen_failed(self) -> bool:
        record = self._record
        try:
            reopened = await run(POSTGRES, RecordActivities.reopen_failed, record.certificate_id)
        except ActivityError:
            return False  # the row is gone
        self._set_record(reopened)
        return reopened.status is not CertificateStatus.FAILED

    async def _wait_for_renewal(self) -> bool:
        """Sleep until the renewal time, or renew/stop; True when it is time to renew
        (False: the history grew long, the next run goes on waiting)."""
        if self._after_issuance or workflow.patched(RENEWAL_INFO_SWEEP_PATCH):
            return await self._sleep_until_renewal()
        await self._ask_and_wait_for_renewal()
        return True

    async def _sleep_until_renewal(self) -> bool:
        """One timer to the renewal time, spread per certificate; the CA's ARI window
        comes from the row and from the renewal-info sweep's signal."""
        record = self._record
        assert record.not_before and record.expires_at
        fraction = certificate_fraction(record.hostname, record.not_before)
        while self._stop is None and not self._renew_requested:
            window = self._record.ari_window
            renew_at = spread_renewal_time(record.not_before, record.expires_at, window, fraction)
            now = workflow.now()
            if renew_at <= now:
                # At once: the window was open when the certificate was young, or the
                # sweep's answer after a hold says now: its replacement is held if the
                # CA says the same again.
                if window is not None and (self._young(now) or self._ari_hold_released):
                    if (
                        self._renewed_at_once
                        and not self._ari_hold_released
                        and workflow.patched(ARI_ONCE_PER_WINDOW_PATCH)
                    ):
                        await self._hold_at_once_window(fraction)
                        continue
                    workflow.logger.info(
                        "the CA's renewal window for %s is open already, an hour after"
                        " issuance or less: renewing once",
                        record.hostname,
                    )
                    self._renewing_at_once = True
                return True
            if workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN:
                return False
            self._window_moved = False
            self._next_attempt_at = renew_at
            self._enter(Phase.WAITING_FOR_RENEWAL)
            try:
                await workflow.wait_condition(
                    lambda: self._renew_requested or self._stop is not None or self._window_moved,
                    timeout=renew_at - now,
                    timeout_summary=f"renewal at {renew_at:%Y-%m-%d %H:%M} UTC",
                )
            except asyncio.TimeoutError:
                pass
            self._next_attempt_at = None
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
        self._window_moved = False
        self._next_attempt_at = backstop
        self._enter(Phase.WAITING_FOR_RENEWAL_INFO)
        try:
            await workflow.wait_condition(
                lambda: self._renew_requested or self._stop is not None or self._window_moved,
                timeout=max(backstop - workflow.now(), timedelta(seconds=1)),
                timeout_summary="the next renewal-info answer",
            )
        except asyncio.TimeoutError:
            pass
        self._next_attempt_at = None
        self._ari_hold_released = True

    async def _ask_and_wait_for_renewal(self) -> None:
        """How runs from before RENEWAL_INFO_SWEEP_PATCH wait: asking the CA's ARI
        themselves at the interval it gives."""
        record = self._record
        assert record.not_before and record.expires_at
        fraction = workflow.random().random()
        while self._stop is None and not self._renew_requested:
            if workflow.info().is_continue_as_new_suggested():
                break  # the next run starts this wait afresh with a short history
            self._enter(Phase.ASKING_RENEWAL_INFO)
            try:
                advice = await run(CA, AcmeActivities.renewal_info, record.certificate_id)
            except ActivityError:
                # ARI is advice: without it the lifetime rule applies; ask again later.
                advice = RenewalAdvice(recheck_after_seconds=3600)
            window = None
            if advice.window_start is not None and advice.window_end is not None:
                window = (advice.window_start, advice.window_end)
            renew_at = renewal_time(record.not_before, record.expires_at, window, fraction)
            now = workflow.now()
            if renew_at <= now:
                break
            wake = renew_at
            if advice.recheck_after_seconds:
                wake = min(wake, now + timedelta(seconds=advice.recheck_after_seconds))
            self._enter(Phase.WAITING_FOR_RENEWAL)
            self._next_attempt_at = renew_at
            self._publish()
            try:
                await workflow.wait_condition(
                    lambda: self._renew_requested or self._stop is not None,
                    timeout=wake - now,
                    timeout_summary=f"renewal at {renew_at:%Y-%m-%d %H:%M} UTC",
                )
            except asyncio.TimeoutError:
                pass
            self._next_attempt_at = None
            if workflow.now() >= renew_at:
                break
        if workflow.info().is_continue_as_new_suggested() and not (
            self._renew_requested or self._stop
        ) and workflow.now() < record.expires_at:
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._next_run_input())

    async def _read_row(self, tenant_id: str | None) -> None:
        """The row and the worker's policy, read (the row made if missing)."""
        ensured = await run(
            POSTGRES,
            RecordActivities.ensure_certificate,
            EnsureCertificateInput(hostname=self._hostname, tenant_id=tenant_id),
        )
        self._set_record(ensured.record)
        self._policy = ensured.policy

    async def _begin_renewal(self) -> None:
        if self._after_issuance:
            # Months after the carried row and policy were read: read both again, so
            # settings changed since (webhooks, backoffs) apply to this renewal.
            await self._read_row(self._record.tenant_id)
            if self._record.status is not CertificateStatus.ACTIVE:
                return  # the row moved on (canceled by the product): the loop decides
        record = self._record
        self._renew_requested = False
        self._enter(Phase.RENEWING)
        renewing = await run(POSTGRES, RecordActivities.begin_renewal, record.certificate_id)
        self._set_record(record.model_copy(
            update={"status": CertificateStatus.RENEWING if renewing else record.status}
        ))
        if not renewing:
            refreshed = await run(
                POSTGRES,
                RecordActivities.ensure_certificate,
                EnsureCertificateInput(hostname=record.hostname, tenant_id=record.tenant_id),
            )
            self._set_record(refreshed.record)

    async def _expire_if_lapsed(self) -> None:
        record = self._record
        if (
            record.status is CertificateStatus.RENEWING
            and record.expires_at is not None
            and workflow.now() >= record.expires_at
        ):
            if await run(POSTGRES, RecordActivities.mark_expired, record.certificate_id):
                self._set_record(record.model_copy(update={"status": CertificateStatus.EXPIRED}))

    async def _finish_stop(self, stop: _StopRequest) -> CertificateState:
        """Cancel (and for delete: revoke if asked, then remove the rows)."""
        record = self._record
        self._enter(Phase.CANCELING)
        open_order = await run(POSTGRES, RecordActivities.cancel_certificate, record.certificate_id)
        record = record.model_copy(
            update={"status": CertificateStatus.CANCELED, "order_url": None, "challenge_url": None}
        )
        self._set_record(record)
        if open_order.order_url:
            try:
                await run(
                    BEST_EFFORT, AcmeActivities.deactivate_authorizations, open_order.order_url
                )
            except ActivityError:
                workflow.logger.warning("could not deactivate the open authorization")
        await self._notify("canceled")
        if stop.delete:
            if stop.revoke and record.expires_at is not None:
                self._enter(Phase.REVOKING)
                try:
                    await run(CA, AcmeActivities.revoke_certificate, record.certificate_id)
                except ActivityError as err:
                    failure = failure_of(err)
                    self._set_record(record.model_copy(
                        update={"error_code": failure.code, "error_message": failure.message}
                    ))
                    return await self._end(Phase.NOT_DELETED)
            await run(POSTGRES, RecordActivities.delete_certificate, record.certificate_id)
            return await self._end(Phase.DELETED)
        return await self._end(Phase.CANCELED)

    async def _end(self, phase: Phase) -> CertificateState:
        self._enter(phase)
        self._stopped = True
        self._retry_requested = self._renew_requested = False
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._state()

    def _publish(self) -> None:
        """Show the state in the Temporal UI: search attributes (when the worker
        registered them) and the workflow's current details. Nothing secret.

        Called after every change of the record or the phase (``_set_record``,
        ``_enter``) and of the next wake-up. The attributes are upserted only when
        what they show changed; the first upsert of a run happens at its first
        change after the policy was read, and histories depend on that moment."""
        record = self._current
        if record is None:
            return
        if self._policy.search_attributes:
            updates: list[SearchAttributeUpdate[Any]] = [
                search.HOSTNAME.value_set(record.hostname),
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
            issuer = self._shown_issuer(record)
            if issuer is not None:  # never set by histories from before issuers
                updates.append(search.ISSUER.value_set(issuer))
            shown = self._shown(record)
            if shown != self._published:
                self._published = shown
                workflow.upsert_search_attributes(updates)
        details = [f"**{record.status}** — {self._phase}"]
        if self._next_attempt_at is not None:
            details.append(f"next: {self._next_attempt_at:%Y-%m-%d %H:%M:%S} UTC")
        if record.error_code:
            details.append(f"last error: {record.error_code}: {record.error_message or ''}")
        if record.expires_at is not None:
            details.append(f"expires: {record.expires_at:%Y-%m-%d %H:%M} UTC")
        workflow.set_current_details("\n\n".join(details))

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
            waits = CarriedWaits(
                dns_failures=self._dns_failures,
                warned_expiring=self._warned_expiring,
                renewed_at_once=self._renewed_at_once,
                passed_over=self._passed_over,
                unreachable_since=self._unreachable_since,
                caa_disagreements=self._caa_disagreements,
                accepted_challenge=self._accepted_challenge,
                retry_requested=self._retry_requested,
            )
        if after_issuance and self._renewing_at_once:
            waits = CarriedWaits(renewed_at_once=True)
        return CertificateInput(
            hostname=record.hostname,
            tenant_id=record.tenant_id,
            carried=record,
            waits=waits,
            policy=self._policy if after_issuance else None,
        )

    def _check_stop(self) -> None:
        if self._stop is not None:
            raise _Stopped()

    async def _sleep(self, seconds: float, *, interruptible: bool) -> bool:
        """A durable wait that cancel/delete always end and, when interruptible,
        "retry now" ends too (also one sent during the attempt before it).
        Returns whether "retry now" ended it."""
        if seconds <= 0:
            return False
        self._next_attempt_at = workflow.now() + timedelta(seconds=seconds)
        self._retry_cuts_wait = interruptible
        self._publish()
        retried = False
        try:
            await workflow.wait_condition(
                lambda: self._stop is not None or (interruptible and self._retry_requested),
                timeout=timedelta(seconds=seconds),
                timeout_summary=f"{self._phase} until {self._next_attempt_at:%H:%M:%S} UTC",
            )
            retried = self._stop is None
        except asyncio.TimeoutError:
            pass
        finally:
            self._next_attempt_at = None
            self._retry_cuts_wait = False
            if interruptible:
                self._retry_requested = False
        return retried

    # -- what the product and operators see and do -------------------------------

    def _state(self) -> CertificateState:
        record = self._current
        if record is None:
            return CertificateState(
                hostname=self._hostname, status=CertificateStatus.PENDING, phase=self._phase
            )
        return CertificateState(
            hostname=record.hostname,
            status=record.status,
            phase=self._phase,
            error_code=record.error_code,
            error_message=record.error_message,
            retry_count=record.retry_count,
            next_attempt_at=self._next_attempt_at,
            expires_at=record.expires_at,
            issuer=record.issuer,
            order_issuer=record.order_issuer,
        )

    @workflow.query(name="status")
    def status(self) -> CertificateState:
        """Current status, phase, next wake-up and last error."""
        return self._state()

    @workflow.signal(name="retry")
    def retry_signal(self) -> None:
        """Retry now: cut short a DNS or failure backoff and reset a FAILED budget;
        order again from a CA whose CAA check refused. Never bypasses a CA rate-limit
        cooldown."""
        self._retry_requested = True
        self._caa_disagreements = {}

    @workflow.update(name="retry")
    async def retry_update(self) -> CertificateState:
        """Retry now; answers the state once the wait was cut short."""
        await workflow.wait_condition(lambda: self._current is not None)
        self._check_retry()
        self._retry_requested = True
        self._caa_disagreements = {}
        # Answer once the wait it cuts short has ended; during a step, or a wait that
        # retry does not cut (order polling), answer now: the request stays noted.
        await workflow.wait_condition(
            lambda: not self._retry_requested or self._stopped or not self._retry_cuts_wait
        )
        # A FAILED certificate answers once its budget is reset, not with the old state.
        await workflow.wait_condition(
            lambda: self._stopped
            or self._retry_cuts_wait
            or self._current is None
            or self._current.status is not CertificateStatus.FAILED
        )
        return self._state()

    @retry_update.validator
    def _validate_retry(self) -> None:
        self._reject_when_stopping("retry")
        if self._current is not None:  # else the handler decides once the row is read
            self._check_retry()

    def _check_retry(self) -> None:
        record = self._record
        if record.status in (CertificateStatus.ACTIVE, CertificateStatus.CANCELED):
            hint = "; use renew to renew it now" if record.status is CertificateStatus.ACTIVE else ""
            raise ApplicationError(
                f"nothing to retry: {record.hostname} is {record.status}{hint}", non_retryable=True
            )

    @workflow.signal(name="renewal_window")
    def renewal_window_signal(self, window: RenewalWindow) -> None:
        """The CA's ARI window moved (sent by the renewal-info sweep): plan again. A
        window for another certificate (the one just replaced) changes nothing."""
        if self._current is not None and self._current.serial != window.serial:
            return
        if self._current is not None:
            self._current = self._current.model_copy(
                update={"ari_window_start": window.start, "ari_window_end": window.end}
            )
        self._window_moved = True

    @workflow.signal(name="renew")
    def renew_signal(self) -> None:
        """Renew now, if the certificate is ACTIVE."""
        self._renew_requested = True

    @workflow.update(name="renew")
    async def renew_update(self) -> CertificateState:
        """Renew now; answers once the renewal has started."""
        await workflow.wait_condition(lambda: self._current is not None)
        self._check_renew()
        self._renew_requested = True
        await workflow.wait_condition(lambda: not self._renew_requested or self._stopped)
        return self._state()

    @renew_update.validator
    def _validate_renew(self) -> None:
        self._reject_when_stopping("renew")
        if self._current is not None:  # else the handler decides once the row is read
            self._check_renew()

    def _check_renew(self) -> None:
        record = self._record
        if record.status is not CertificateStatus.ACTIVE:
            raise ApplicationError(
                f"nothing to renew: {record.hostname} is {record.status};"
                " only an ACTIVE certificate renews",
                non_retryable=True,
            )

    @workflow.signal(name="cancel")
    def cancel_signal(self) -> None:
        """Stop provisioning and renewal; the status becomes CANCELED."""
        if self._stop is None:
            self._stop = _StopRequest(delete=False, revoke=False)

    @workflow.update(name="cancel")
    async def cancel_update(self) -> CertificateState:
        """Cancel; answers once the certificate is CANCELED."""
        self.cancel_signal()
        await workflow.wait_condition(lambda: self._stopped)
        return self._state()

    @cancel_update.validator
    def _validate_cancel(self) -> None:
        self._reject_when_stopping("cancel")

    @workflow.signal(name="delete")
    def delete_signal(self, request: DeleteRequest | None = None) -> None:
        """Cancel, optionally revoke the current certificate, and remove the rows."""
        revoke = request.revoke if request is not None else False
        if self._stop is None or not self._stop.delete:
            self._stop = _StopRequest(delete=True, revoke=revoke)

    @workflow.update(name="delete")
    async def delete_update(self, request: DeleteRequest | None = None) -> CertificateState:
        """Delete; answers once the rows are gone (or the revocation failed)."""
        self.delete_signal(request)
        await workflow.wait_condition(lambda: self._stopped)
        return self._state()

    @delete_update.validator
    def _validate_delete(self, request: DeleteRequest | None = None) -> None:
        if self._stop is not None and self._stop.delete:
            raise ValueError(f"{self._hostname} is already being deleted")

    def _reject_when_stopping(self, action: str) -> None:
        if self._stop is not None or self._stopped:
            raise ValueError(f"cannot {action}: {self._hostname} is canceled")


@dataclass(frozen=True)
class _StopRequest:
    delete: bool
    revoke: bool
