"""How the Certificate workflow runs its activities: the timeouts and retry policy
of each kind of step, what each activity shows in the Temporal UI, and how a
failed activity becomes the attempt's error code (docs/lifecycle.md, "Statuses and errors").

Activities are called by typed reference (``execute_activity_method``); their
registered names are pinned by ``@activity.defn(name=…)`` (activities/registry.py
lists them), so histories recorded before typed references replay unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from activities.registry import CERTIFICATE_ACTIVITIES
    from certflow.errors import CertflowError, ErrorCode

S = TypeVar("S")
A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True)
class Step:
    """Timeouts and retry policy of one kind of activity."""

    start_to_close: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None
    schedule_to_close: timedelta | None = None


# Postgres steps retry until Postgres is back: nothing is decided by their failure.
POSTGRES = Step(
    timedelta(seconds=30),
    RetryPolicy(
        initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10)
    ),
)
# The same as a local activity, for a minute: past it the workflow runs the step as
# a regular activity, whose retries add nothing to the history (a local one's past
# its first minute each add a timer and a workflow task).
POSTGRES_LOCAL = Step(
    POSTGRES.start_to_close, POSTGRES.retry, schedule_to_close=timedelta(seconds=60)
)
# Short faults (resets, 5xx, badNonce, timeouts, a DNS resolver's SERVFAIL) are
# absorbed for a few seconds before they count as one failed attempt; every other
# error code goes straight back to the workflow, which decides.
SHORT_FAULT_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=4),
    maximum_attempts=4,
    non_retryable_error_types=[str(c) for c in ErrorCode if c is not ErrorCode.ACME_TEMPORARY],
)
DNS = Step(timedelta(seconds=60), SHORT_FAULT_RETRY)
# Publishing the dns-01 TXT waits for every authoritative server, heartbeating:
# a worker killed in that wait is noticed in 25 s (one update or one round of
# queries, each bounded by 10 s, fits between two heartbeats), not 60.
DNS01_PUBLISH = Step(timedelta(seconds=60), SHORT_FAULT_RETRY, heartbeat=timedelta(seconds=25))
# Single CA exchanges: short, so a worker killed mid-call is noticed quickly.
CA = Step(timedelta(seconds=20), SHORT_FAULT_RETRY)
FINALIZE = Step(timedelta(seconds=90), SHORT_FAULT_RETRY, heartbeat=timedelta(seconds=10))
BEST_EFFORT = Step(timedelta(seconds=20), RetryPolicy(maximum_attempts=3))


def order_wait(fast_poll_seconds: float) -> Step:
    """wait_for_order polls inside the activity for ``fast_poll_seconds``, heartbeating."""
    return Step(
        timedelta(seconds=fast_poll_seconds + 30), SHORT_FAULT_RETRY, heartbeat=timedelta(seconds=10)
    )


def validate_order(fast_poll_seconds: float) -> Step:
    """validate_order: the self-check (up to 20 s), then wait_for_order's poll."""
    return Step(
        timedelta(seconds=fast_poll_seconds + 50), SHORT_FAULT_RETRY, heartbeat=timedelta(seconds=10)
    )


# order_and_validate does the work of two activities that had four tries each
# (place_order, validate_order), with more requests to the CA per try (each a
# chance of a short fault): it keeps both budgets, so short faults are absorbed as
# before it. A retry resumes the order the last try persisted.
ORDER_AND_VALIDATE_RETRY = RetryPolicy(
    initial_interval=SHORT_FAULT_RETRY.initial_interval,
    maximum_interval=SHORT_FAULT_RETRY.maximum_interval,
    maximum_attempts=2 * SHORT_FAULT_RETRY.maximum_attempts,
    non_retryable_error_types=SHORT_FAULT_RETRY.non_retryable_error_types,
)


def order_and_validate(fast_poll_seconds: float) -> Step:
    """order_and_validate: a new order (a CA exchange, 20 s), then validate_order's work."""
    return Step(
        timedelta(seconds=fast_poll_seconds + 70), ORDER_AND_VALIDATE_RETRY, heartbeat=timedelta(seconds=10)
    )


async def run_local(step: Step, activity: Callable[[S, A], Awaitable[R]], arg: A) -> R:
    """Run a short activity of the workflow as a local activity: its result is one
    marker in the workflow task that asked for it, no task of its own. It fails
    as a regular one does, with an ActivityError (the SDK raises a local
    activity's failure bare)."""
    try:
        result: R = await workflow.execute_local_activity_method(
            activity,
            arg,
            start_to_close_timeout=step.start_to_close,
            schedule_to_close_timeout=step.schedule_to_close,
            retry_policy=step.retry,
            summary=CERTIFICATE_ACTIVITIES[activity],
        )
    except (ApplicationError, TemporalTimeout) as failure:
        error = ActivityError(
            "local activity failed",
            scheduled_event_id=0,
            started_event_id=0,
            identity="",
            activity_type=getattr(activity, "__name__", "local activity"),
            activity_id="",
            retry_state=None,
        )
        raise error from failure
    return result


async def run(step: Step, activity: Callable[[S, A], Awaitable[R]], arg: A) -> R:
    """Run one activity of the workflow with its step's timeouts and retries."""
    result: R = await workflow.execute_activity_method(
        activity,
        arg,
        start_to_close_timeout=step.start_to_close,
        heartbeat_timeout=step.heartbeat,
        retry_policy=step.retry,
        summary=CERTIFICATE_ACTIVITIES[activity],
    )
    return result


class AttemptFailed(CertflowError):
    """An attempt ended with an error code (docs/lifecycle.md, "Statuses and errors") and a message for the product."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        retry_after: float | None,
        unreachable: bool = False,
        accepted: bool = False,
        lost: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.unreachable = unreachable
        """The CA did not answer at all (AcmeProblemError.unreachable)."""
        self.accepted = accepted
        """The CA answered the attempt's accept before it failed (AcmeProblemError.accepted)."""
        self.lost = lost
        """The attempt ended on our own infrastructure, not on an answer of the CA's
        nor a fault of the network's: the step's last try timed out (its worker never
        reported back: killed, or stalled), or Postgres did not answer it
        (StoreUnavailableError)."""


def failure_of(err: ActivityError) -> AttemptFailed:
    """The attempt's error from a failed activity: its typed code and data (a Postgres
    outage is also ``lost``), or ACME_TEMPORARY for anything untyped (a crash; a
    timeout, which is also ``lost``)."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type and cause.type in ErrorCode.__members__:
        details: dict[str, Any] = {}
        if cause.details and isinstance(cause.details[0], dict):
            details = cause.details[0]
        return AttemptFailed(
            ErrorCode(cause.type),
            str(details.get("message") or cause.message),
            details.get("retry_after_seconds"),
            bool(details.get("unreachable")),
            bool(details.get("accepted")),
            # Data of the failure, so histories recorded before it replay unchanged.
            lost=bool(details.get("store_unavailable")),
        )
    reason = str(cause or err)
    return AttemptFailed(
        ErrorCode.ACME_TEMPORARY,
        f"{err.activity_type} failed: {reason}",
        None,
        lost=isinstance(cause, TemporalTimeout),
    )
