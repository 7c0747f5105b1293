"""The Certificate workflow: one per hostname, the certificate's state machine.

Every side effect is an activity; every decision is a pure function in
:mod:`workflows.policy`. Waits are durable timers that "retry now" can cut
short (except a rate-limit cooldown, which nobody may bypass).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from dataclasses import dataclass
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from certflow.errors import ErrorCode
    from certflow.models import (
        AcceptChallengeInput,
        CertificateInput,
        CertificateRecord,
        CertificateState,
        CertificateStatus,
        CheckDnsInput,
        CreateOrderInput,
        EnsureCertificateInput,
        EnsureCertificateResult,
        FinalizeInput,
        IssuedCertificate,
        OpenedOrder,
        OrderProgress,
        PersistChallengeInput,
        ProvisioningPolicy,
        RecordFailureInput,
        WaitForOrderInput,
        WORKFLOW_TYPE,
    )
    from workflows.policy import (
        DNS_CODES,
        decide_outcome,
        dns_recheck_delay,
        failure_backoff,
        order_poll_delay,
    )

T = TypeVar("T")

_NOT_RETRYABLE = [str(c) for c in ErrorCode if c is not ErrorCode.ACME_TEMPORARY]

@dataclass(frozen=True)
class _Step:
    """Timeouts and retry policy of one kind of activity."""

    start_to_close: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None


# Postgres steps retry until Postgres is back: nothing is decided by their failure.
_POSTGRES = _Step(
    timedelta(seconds=30),
    RetryPolicy(
        initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10)
    ),
)
# Short faults (resets, 5xx, badNonce, timeouts) are absorbed for a few seconds
# before they count as one failed attempt.
_CA_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=4),
    maximum_attempts=4,
    non_retryable_error_types=_NOT_RETRYABLE,
)
_DNS = _Step(timedelta(seconds=60), _CA_RETRY)
# Single CA exchanges: short, so a worker killed mid-call is noticed quickly.
_CA = _Step(timedelta(seconds=20), _CA_RETRY)
_FINALIZE = _Step(timedelta(seconds=90), _CA_RETRY, heartbeat=timedelta(seconds=10))


async def _run(step: _Step, activity: str, arg: Any, result_type: type[T]) -> T:
    result: T = await workflow.execute_activity(
        activity,
        arg,
        result_type=result_type,
        start_to_close_timeout=step.start_to_close,
        heartbeat_timeout=step.heartbeat,
        retry_policy=step.retry,
    )
    return result


class _AttemptFailed(Exception):
    def __init__(self, code: ErrorCode, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


def _failure_of(err: ActivityError) -> _AttemptFailed:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type and cause.type in ErrorCode.__members__:
        details: dict[str, Any] = {}
        if cause.details and isinstance(cause.details[0], dict):
            details = cause.details[0]
        return _AttemptFailed(
            ErrorCode(cause.type),
            str(details.get("message") or cause.message),
            details.get("retry_after_seconds"),
        )
    reason = str(cause or err)
    return _AttemptFailed(ErrorCode.ACME_TEMPORARY, f"{err.activity_type} failed: {reason}", None)


@workflow.defn(name=WORKFLOW_TYPE)
class CertificateWorkflow:
    """Issues the certificate of one hostname and keeps its row current."""

    def __init__(self) -> None:
        self._record: CertificateRecord | None = None
        self._hostname = ""
        self._phase = "starting"
        self._next_attempt_at: datetime | None = None
        self._retry_requested = False

    @workflow.run
    async def run(self, input: CertificateInput) -> CertificateState:
        self._hostname = input.hostname
        ensured = await _run(
            _POSTGRES,
            "ensure_certificate",
            EnsureCertificateInput(hostname=input.hostname, tenant_id=input.tenant_id),
            EnsureCertificateResult,
        )
        self._record = ensured.record
        policy = ensured.policy
        if self._record.status in (CertificateStatus.ACTIVE, CertificateStatus.CANCELED):
            self._phase = "done"
            return self._state()

        dns_failures = 0
        while True:
            if self._record.status is CertificateStatus.FAILED:
                await self._wait_failed(policy)
                if not await self._reopen_failed():
                    self._phase = "done"
                    return self._state()
            try:
                issued = await self._issue(self._record, policy)
            except _AttemptFailed as failure:
                dns_failures = dns_failures + 1 if failure.code in DNS_CODES else 0
                if not await self._record_failure(failure, policy):
                    self._phase = "done"
                    return self._state()
                await self._wait_after(failure, policy, dns_failures)
                continue
            self._record = self._record.model_copy(
                update={
                    "status": CertificateStatus.ACTIVE,
                    "error_code": None,
                    "error_message": None,
                    "retry_count": 0,
                    "order_url": None,
                    "challenge_url": None,
                    "expires_at": issued.not_after,
                }
            )
            self._phase = "done"
            return self._state()

    async def _issue(self, record: CertificateRecord, policy: ProvisioningPolicy) -> IssuedCertificate:
        """One attempt: DNS, order, challenge, wait, finalize and store."""
        try:
            order_url, challenge_url = record.order_url, record.challenge_url
            if order_url is None:
                if not record.skips_dns:
                    self._phase = "checking DNS"
                    await _run(_DNS, "check_dns", CheckDnsInput(hostname=record.hostname), type(None))
                self._phase = "creating order"
                order = await _run(
                    _CA, "create_order", CreateOrderInput(hostname=record.hostname), OpenedOrder
                )
                persisted = await _run(
                    _POSTGRES,
                    "persist_challenge",
                    PersistChallengeInput(certificate_id=record.certificate_id, order=order),
                    bool,
                )
                if not persisted:
                    raise _AttemptFailed(
                        ErrorCode.ACME_INVALID_ORDER, "the certificate row moved on", None
                    )
                order_url, challenge_url = order.order_url, order.challenge_url
                self._record = record = record.model_copy(
                    update={
                        "order_url": order_url,
                        "challenge_url": challenge_url,
                        "status": record.status
                        if record.status in (CertificateStatus.RENEWING, CertificateStatus.EXPIRED)
                        else CertificateStatus.PROVISIONING,
                        "error_code": None,
                        "error_message": None,
                    }
                )
                self._phase = "accepting challenge"
                await _run(
                    _CA,
                    "accept_challenge",
                    AcceptChallengeInput(challenge_url=challenge_url),
                    type(None),
                )
            await self._wait_for_order(order_url, challenge_url, policy)
            self._phase = "finalizing"
            return await _run(
                _FINALIZE,
                "finalize_and_store",
                FinalizeInput(
                    certificate_id=record.certificate_id,
                    hostname=record.hostname,
                    order_url=order_url,
                ),
                IssuedCertificate,
            )
        except ActivityError as err:
            raise _failure_of(err) from None

    async def _wait_for_order(
        self, order_url: str, challenge_url: str | None, policy: ProvisioningPolicy
    ) -> None:
        """Poll fast inside an activity, then on durable timers that back off."""
        attempt = 0
        while True:
            self._phase = "polling order"
            progress = await _run(
                _Step(
                    timedelta(seconds=policy.order_fast_poll_seconds + 30),
                    _CA_RETRY,
                    heartbeat=timedelta(seconds=10),
                ),
                "wait_for_order",
                WaitForOrderInput(
                    order_url=order_url,
                    challenge_url=challenge_url,
                    within_seconds=policy.order_fast_poll_seconds,
                ),
                OrderProgress,
            )
            if progress.status in ("ready", "valid"):
                return
            delay = order_poll_delay(attempt, progress.retry_after_seconds)
            attempt += 1
            self._phase = f"order {progress.status}; polling again"
            await self._sleep(delay, interruptible=False)

    async def _record_failure(self, failure: _AttemptFailed, policy: ProvisioningPolicy) -> bool:
        record = self._record
        assert record is not None
        outcome = decide_outcome(
            record.status,
            record.retry_count,
            record.order_url is not None,
            failure.code,
            policy.max_failures,
        )
        applied = await _run(
            _POSTGRES,
            "record_failure",
            RecordFailureInput(
                certificate_id=record.certificate_id, outcome=outcome, message=failure.message
            ),
            bool,
        )
        keep = outcome.keep_order
        self._record = record.model_copy(
            update={
                "status": outcome.status,
                "retry_count": outcome.retry_count,
                "error_code": outcome.error_code,
                "error_message": failure.message,
                "order_url": record.order_url if keep else None,
                "challenge_url": record.challenge_url if keep else None,
            }
        )
        return applied

    async def _wait_after(
        self, failure: _AttemptFailed, policy: ProvisioningPolicy, dns_failures: int
    ) -> None:
        record = self._record
        assert record is not None
        if record.status is CertificateStatus.FAILED:
            return
        if failure.code is ErrorCode.ACME_RATE_LIMITED:
            self._phase = "waiting for the CA's rate limit to end"
            # Retry-After 0 means "now", but a CA repeating it must not spin us.
            await self._sleep(max(failure.retry_after or 0.0, 1.0), interruptible=False)
        elif failure.code in DNS_CODES:
            self._phase = "waiting for DNS to be fixed"
            await self._sleep(dns_recheck_delay(dns_failures, policy), interruptible=True)
        else:
            self._phase = "waiting before the next attempt"
            await self._sleep(failure_backoff(record.retry_count, policy), interruptible=True)

    async def _wait_failed(self, policy: ProvisioningPolicy) -> None:
        self._phase = "failed; waiting for retry"
        if policy.failed_retry_seconds > 0:
            await self._sleep(policy.failed_retry_seconds, interruptible=True)
        else:
            self._next_attempt_at = None
            await workflow.wait_condition(lambda: self._retry_requested)
            self._retry_requested = False

    async def _reopen_failed(self) -> bool:
        record = self._record
        assert record is not None
        reopened = await _run(_POSTGRES, "reopen_failed", record.certificate_id, bool)
        if reopened:
            self._record = record.model_copy(
                update={"status": CertificateStatus.PENDING, "retry_count": 0}
            )
        return reopened

    async def _sleep(self, seconds: float, *, interruptible: bool) -> None:
        """A durable wait; "retry now" (also one sent during the attempt before
        it) ends an interruptible one early."""
        if seconds <= 0:
            return
        self._next_attempt_at = workflow.now() + timedelta(seconds=seconds)
        try:
            if interruptible:
                await workflow.wait_condition(
                    lambda: self._retry_requested, timeout=timedelta(seconds=seconds)
                )
            else:
                await workflow.sleep(timedelta(seconds=seconds))
        except asyncio.TimeoutError:
            pass
        finally:
            self._next_attempt_at = None
            if interruptible:
                self._retry_requested = False

    def _state(self) -> CertificateState:
        record = self._record
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
        )

    @workflow.query(name="status")
    def status(self) -> CertificateState:
        """Current status, phase, next wake-up and last error."""
        return self._state()

    @workflow.signal(name="retry")
    def retry_signal(self) -> None:
        """Retry now: cut short a DNS or failure backoff (never a rate-limit cooldown)."""
        self._retry_requested = True

    @workflow.update(name="retry")
    async def retry_update(self) -> CertificateState:
        """Retry now; answers the state as the request is taken (the wait ends right after)."""
        self._retry_requested = True
        return self._state()

    @retry_update.validator
    def _validate_retry(self) -> None:
        record = self._record
        if record is None or record.status in (
            CertificateStatus.ACTIVE,
            CertificateStatus.CANCELED,
        ):
            status = record.status if record else "starting"
            raise ValueError(f"nothing to retry: {self._hostname} is {status}")
