"""Obtaining a certificate: one attempt, from the DNS check through the order, the
challenge and its self-check, the wait for the order, to finalize and store; the CA
chosen among those CAA allows."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.acme import AcmeActivities
    from activities.dns import DnsActivities
    from activities.obtain import ObtainActivities
    from activities.records import RecordActivities
    from certflow.errors import ErrorCode
    from certflow.issuers import DEFAULT_ISSUER
    from certflow.models import (
        ISSUABLE,
        CertificateRecord,
        CertificateStatus,
        OrderKind,
        Phase,
        ValidationMethod,
    )
    from certflow.activity_payloads import (
        CheckDnsInput,
        Dns01ChallengeInput,
        FinalizeInput,
        IssuedCertificate,
        OrderAndValidateInput,
        OrderProgress,
        PlaceOrderInput,
        PlacedOrder,
        RowRequest,
        ValidateOrderInput,
        WaitForOrderInput,
    )
    from certflow.workflow_payloads import ProvisioningPolicy
    from workflows.policy import choose_issuer, issuer_reason, order_poll_delay
    from workflows.run_state import Stopped
    from workflows.steps import (
        DNS,
        DNS01_PUBLISH,
        FINALIZE,
        AttemptFailed,
        failure_of,
        order_and_validate,
        run,
        run_local,
        validate_order,
    )

from workflows import rows
from workflows.base import CertificateBase
from workflows.patches import HISTORY_EVENTS_BEFORE_NEW_RUN


class Obtaining(CertificateBase):
    """One attempt at a certificate (``_issue``)."""

    async def _issue(self, record: CertificateRecord, policy: ProvisioningPolicy) -> IssuedCertificate:
        """One attempt: DNS, order, challenge, wait, finalize and store."""
        try:
            # What the search attributes show next is what the attempt comes to,
            # unless it waits on the way (released there).
            self._state.attributes_held = True
            self._state.caa_reading = None
            placed: PlacedOrder | None = None  # this attempt's order, as persisted
            validated: OrderProgress | None = None  # its validation, run with the order
            if record.order_url is None:
                record, placed, validated = await self._open_order(record, policy)
                method = placed.method
                # Before the CA is asked: the HTTP-01 fetch as it will make it, or our
                # dns-01 TXT on every server; a persist record is read by the CA itself.
                self_check = validated is None and method in (None, ValidationMethod.HTTP_01)
                publish = method is ValidationMethod.DNS_01
                accept_first, accept_unsure = True, False
            else:
                self._state.attributes_held = False
                self._state.issuer = record.order_issuer  # the kept order's CA
                method = record.validation_method  # None: http-01
                # Kept when its self-check failed, or before its TXT was everywhere:
                # never accepted.
                self_check = record.error_code is ErrorCode.HTTP01_UNREACHABLE
                publish = record.error_code in (ErrorCode.DNS01_UPDATE, ErrorCode.DNS01_NOT_VISIBLE)
                # The accept may have failed unanswered (or been answered before this
                # run): the activity reads the challenge and POSTs only if pending.
                accept_unsure = not (self_check or publish) and record.challenge_url not in (
                    None, self._state.accepted_challenge
                )
                accept_first = self_check or publish or accept_unsure
            order_url, challenge_url = record.order_url, record.challenge_url
            assert order_url is not None  # placed, or kept on the row
            if publish:
                self._enter(Phase.PUBLISHING_DNS01)
                await run(
                    DNS01_PUBLISH,
                    DnsActivities.publish_dns01,
                    Dns01ChallengeInput(certificate_id=record.certificate_id, hostname=record.hostname),
                )
                self._check_stop()
            await self._wait_for_order(
                record.certificate_id, order_url, challenge_url, policy, accept_first, accept_unsure,
                self_check and policy.http01_self_check, placed, validated,
            )
            self._check_stop()  # a cancel during polling must not issue a certificate
            self._enter(Phase.FINALIZING)
            issued = await run(
                FINALIZE,
                AcmeActivities.finalize_and_store,
                FinalizeInput(
                    certificate_id=record.certificate_id,
                    hostname=record.hostname,
                    order_url=order_url,
                    issuer=self._state.issuer,
                ),
            )
            if method is ValidationMethod.DNS_01:
                await self._withdraw_dns01(record)  # the order is valid: its TXT goes
            return issued
        except ActivityError as err:
            if self._state.stop is not None:
                raise Stopped() from None
            failure = failure_of(err)
            if failure.accepted:
                self._state.accepted_challenge = record.challenge_url or self._record.challenge_url
            raise failure from None
        finally:
            self._state.attributes_held = False

    async def _open_order(
        self, record: CertificateRecord, policy: ProvisioningPolicy
    ) -> tuple[CertificateRecord, PlacedOrder, OrderProgress | None]:
        """Check DNS (the CAs CAA allows, the methods ready), choose the CA, place the
        order there and validate it: the row as the order left it, the order, and
        its validation (None: a dns-01 challenge, whose TXT goes out first)."""
        allowed = list(policy.issuers)  # a managed hostname: no CAA to ask
        methods: list[ValidationMethod] = []
        method_reason: str | None = None
        if not record.skips_dns:
            self._enter(Phase.CHECKING_DNS)
            row = None
            if rows.just_read(self._state):
                row = RowRequest(requested_method=record.requested_method, tenant_id=record.tenant_id)
            verdict = await run_local(
                DNS, DnsActivities.check_dns, CheckDnsInput(hostname=record.hostname, row=row)
            )
            allowed = verdict.allowed_issuers
            self._state.caa_reading = verdict.caa_reading
            methods, method_reason = verdict.methods, verdict.method_reason
            self._check_stop()
        if self._state.caa_disagreements:
            allowed = self._not_disagreeing(allowed)
        self._choose_issuer(record, allowed, policy)
        self._enter(Phase.ORDERING)
        placed, validated = await self._order_and_validate(
            PlaceOrderInput(
                certificate_id=record.certificate_id,
                hostname=record.hostname,
                kind=self._order_kind(record),
                issuer=self._state.issuer,
                issuer_reason=self._state.issuer_reason,
                methods=methods,
                method_reason=method_reason,
            ),
            policy,
        )
        if validated is not None:
            self._state.accepted_challenge = placed.challenge_url
        # Ready at once: finalize follows, and what the search attributes show next
        # is its outcome; else they show the order before the wait.
        self._state.attributes_held = validated is not None and validated.status in ISSUABLE
        renewal = record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
        record = rows.set_written(
            self._state,
            placed.row,
            record,
            order_url=placed.order_url,
            challenge_url=placed.challenge_url,
            status=record.status if renewal else CertificateStatus.PROVISIONING,
            error_code=None,
            error_message=None,
            order_issuer=self._state.issuer,
            validation_method=placed.method,
        )
        self._check_stop()
        return record, placed, validated

    def _choose_issuer(
        self, record: CertificateRecord, allowed: list[str], policy: ProvisioningPolicy
    ) -> None:
        """The attempt's issuer: the first CAA allows that was not fallen back from; a
        renewal prefers the CA of its certificate (``replaces`` only applies there)."""
        renewal = record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
        preferred = self._named(record.issuer) if renewal else None
        if allowed and all(name in self._state.passed_over for name in allowed):
            self._state.passed_over = {}  # every allowed CA was passed over: a new round
        self._state.allowed = allowed
        self._state.issuer = choose_issuer(allowed, preferred, self._state.passed_over)
        self._state.issuer_reason = issuer_reason(
            self._state.issuer, policy.issuers, allowed, self._state.passed_over, preferred
        )

    def _not_disagreeing(self, allowed: list[str]) -> list[str]:
        """The allowed issuers less those whose own CAA check refused this hostname
        while our reading has not changed since (a CA refused on its reading: ordering
        there again only spends a failed authorization). AttemptFailed DNS_CAA when
        that leaves none."""
        reading = self._state.caa_reading
        kept = []
        for name in allowed:
            disagreement = self._state.caa_disagreements.get(name)
            if disagreement is None:
                kept.append(name)
            elif disagreement.reading is None:
                # Not read when the CA refused: this reading is the one to change from.
                self._state.caa_disagreements[name] = disagreement.model_copy(update={"reading": reading})
            elif disagreement.reading != reading:
                del self._state.caa_disagreements[name]  # the answer changed: try it again
                kept.append(name)
        if kept or not allowed:
            return kept
        name = allowed[0]
        held = self._state.caa_disagreements[name]
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
        if issuer is None and self._state.policy.issuers:
            return self._state.policy.issuers[0]
        return issuer

    def _order_kind(self, record: CertificateRecord) -> OrderKind:
        """How the CA counts this order: a renewal of the certificate in place is
        exempt from some limits, an ARI renewal from nearly all (docs/rate-limits.md); at another
        CA than the certificate's it is a new order there."""
        if record.status not in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED):
            return OrderKind.NEW
        if self._state.issuer is not None and self._named(record.issuer) != self._state.issuer:
            return OrderKind.NEW
        # Boulder's SuggestedWindow.IsWithin: start <= now < end, at the order itself.
        window = record.ari_window
        in_window = window is not None and window[0] <= workflow.now() < window[1]
        return OrderKind.ARI_RENEWAL if in_window else OrderKind.RENEWAL

    async def _order_and_validate(
        self, order: PlaceOrderInput, policy: ProvisioningPolicy
    ) -> tuple[PlacedOrder, OrderProgress | None]:
        """Place the order and validate it in one activity: the order as persisted,
        and its validation (None:
        a dns-01 challenge, whose TXT goes out first). When the activity fails, the
        row is read again: it holds the order when one was placed, which the
        failure keeps or abandons as after place_order."""
        try:
            done = await run(
                order_and_validate(policy.order_fast_poll_seconds),
                ObtainActivities.order_and_validate,
                OrderAndValidateInput(
                    order=order,
                    within_seconds=policy.order_fast_poll_seconds,
                    self_check=policy.http01_self_check,
                ),
            )
        except ActivityError:
            try:
                rows.set_record(
                    self._state,
                    await rows.postgres(RecordActivities.reload_record, order.certificate_id)
                )
            except ActivityError:
                pass  # the row is gone: the failure's record finds that out
            raise
        return done.order, done.progress

    async def _wait_for_order(
        self,
        certificate_id: str,
        order_url: str,
        challenge_url: str | None,
        policy: ProvisioningPolicy,
        accept_first: bool = False,
        accept_unsure: bool = False,
        self_check: bool = False,
        placed: PlacedOrder | None = None,
        validated: OrderProgress | None = None,
    ) -> None:
        """Poll fast inside an activity (accepting the challenge first when asked),
        then on durable timers that back off. The challenge is POSTed at most once:
        never again once the CA answered (docs/lifecycle.md, "How a certificate runs"). That
        activity self-checks the challenge first when asked. ``validated``: the
        first fast poll, done by the activity that placed the order."""
        attempt = 0
        if validated is not None:
            if validated.status in ISSUABLE:
                return
            attempt = await self._poll_again(validated, attempt)
        while True:
            self._check_stop()
            self._enter(Phase.POLLING_ORDER)
            accepting = accept_first and attempt == 0
            wait = WaitForOrderInput(
                order_url=order_url,
                challenge_url=challenge_url,
                within_seconds=policy.order_fast_poll_seconds,
                accept_first=accepting,
                issuer=self._state.issuer,
                accept_unsure=accepting and accept_unsure,
            )
            progress = await run(
                validate_order(policy.order_fast_poll_seconds),
                ObtainActivities.validate_order,
                ValidateOrderInput(
                    wait=wait,
                    certificate_id=certificate_id,
                    hostname=self._state.hostname,
                    self_check=self_check and attempt == 0,
                    token=placed.token if placed else None,
                    key_authorization=placed.key_authorization if placed else None,
                ),
            )
            if accepting:
                self._state.accepted_challenge = challenge_url
            if progress.status in ISSUABLE:
                return
            attempt = await self._poll_again(progress, attempt)

    async def _poll_again(self, progress: OrderProgress, attempt: int) -> int:
        """Wait before the next poll of an order not yet ready (continuing as new
        when the run is long); the next attempt's number."""
        delay = order_poll_delay(attempt, progress.retry_after_seconds)
        self._enter(Phase.polling_again(progress.status))
        # The CA's pacing (Retry-After) is honoured even against "retry now".
        await self._sleep(delay, interruptible=False)
        if (
            workflow.info().get_current_history_length() > HISTORY_EVENTS_BEFORE_NEW_RUN
            and self._state.stop is None
        ):
            # An order the CA keeps pending for days (an incident): the next run
            # goes on polling it from the row, never accepting it again.
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._next_run_input(carry_waits=True))
        return attempt + 1
