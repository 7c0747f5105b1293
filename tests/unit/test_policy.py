"""The outcome table (docs/lifecycle.md, "Statuses and errors"), row by row, and the backoffs."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeout

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus as S
from certflow.workflow_payloads import ProvisioningPolicy
from workflows.policy import (
    DNS_CODES,
    RECHECK_CODES,
    TERMINAL_CODES,
    decide_outcome,
    dns_recheck_delay,
    failure_backoff,
    order_poll_delay,
    retries_automatically,
)
from workflows.steps import failure_of

E = ErrorCode


@pytest.mark.parametrize(
    ("status", "retries", "has_order", "code", "expected"),
    [
        # rate limit: budget untouched, open order kept (PROVISIONING), else PENDING
        (S.PROVISIONING, 1, True, E.ACME_RATE_LIMITED, (S.PROVISIONING, 1, True, E.ACME_RATE_LIMITED)),
        (S.PENDING, 2, False, E.ACME_RATE_LIMITED, (S.PENDING, 2, True, E.ACME_RATE_LIMITED)),
        # DNS: PENDING, budget untouched, ACME state cleared
        (S.PROVISIONING, 1, True, E.DNS_CNAME, (S.PENDING, 1, False, E.DNS_CNAME)),
        (S.PENDING, 2, False, E.DNS_CAA, (S.PENDING, 2, False, E.DNS_CAA)),
        # invalid order: +1, cleared, PENDING
        (S.PROVISIONING, 0, True, E.ACME_INVALID_ORDER, (S.PENDING, 1, False, E.ACME_INVALID_ORDER)),
        # the CA refused on CAA after ours allowed: a failed authorization, +1, cleared
        (S.PROVISIONING, 0, True, E.ACME_CAA, (S.PENDING, 1, False, E.ACME_CAA)),
        (S.RENEWING, 1, True, E.ACME_CAA, (S.RENEWING, 2, False, E.ACME_CAA)),
        (S.PENDING, 2, False, E.ACME_CAA, (S.FAILED, 3, False, E.ACME_FAILED)),
        # temporary: +1, keeps the order when there is one
        (S.PROVISIONING, 0, True, E.ACME_TEMPORARY, (S.PROVISIONING, 1, True, E.ACME_TEMPORARY)),
        (S.PENDING, 1, False, E.ACME_TEMPORARY, (S.PENDING, 2, False, E.ACME_TEMPORARY)),
        # the third failure: FAILED / ACME_FAILED, cleared
        (S.PROVISIONING, 2, True, E.ACME_TEMPORARY, (S.FAILED, 3, False, E.ACME_FAILED)),
        (S.PENDING, 2, False, E.ACME_INVALID_ORDER, (S.FAILED, 3, False, E.ACME_FAILED)),
        # renewal keeps its status where a first issuance would be PENDING/PROVISIONING
        (S.RENEWING, 0, True, E.ACME_TEMPORARY, (S.RENEWING, 1, True, E.ACME_TEMPORARY)),
        (S.EXPIRED, 0, False, E.DNS_CNAME, (S.EXPIRED, 0, False, E.DNS_CNAME)),
        # the CA refused the name or request: FAILED at once with its own code, +1, cleared
        (S.PROVISIONING, 0, True, E.ACME_REJECTED, (S.FAILED, 1, False, E.ACME_REJECTED)),
        (S.PENDING, 2, False, E.ACME_REJECTED, (S.FAILED, 3, False, E.ACME_REJECTED)),
        (S.RENEWING, 1, True, E.ACME_REJECTED, (S.FAILED, 2, False, E.ACME_REJECTED)),
        # HTTP-01 self-check failed: budget untouched, PENDING, the (still valid) order kept
        (S.PROVISIONING, 1, True, E.HTTP01_UNREACHABLE, (S.PENDING, 1, True, E.HTTP01_UNREACHABLE)),
        (S.PENDING, 2, False, E.HTTP01_UNREACHABLE, (S.PENDING, 2, False, E.HTTP01_UNREACHABLE)),
        (S.RENEWING, 0, True, E.HTTP01_UNREACHABLE, (S.RENEWING, 0, True, E.HTTP01_UNREACHABLE)),
        (S.EXPIRED, 2, True, E.HTTP01_UNREACHABLE, (S.EXPIRED, 2, True, E.HTTP01_UNREACHABLE)),
    ],
)
def test_outcome_table(
    status: S, retries: int, has_order: bool, code: ErrorCode, expected: tuple[S, int, bool, ErrorCode]
) -> None:
    outcome = decide_outcome(status, retries, has_order, code)
    assert (outcome.status, outcome.retry_count, outcome.keep_order, outcome.error_code) == expected


@pytest.mark.parametrize(
    ("status", "retries", "has_order", "expected"),
    [
        # a lost worker's attempt at the last of the budget: neither FAILED nor +1
        (S.PROVISIONING, 2, True, (S.PROVISIONING, 2, True, E.ACME_TEMPORARY)),
        # no order known (a lost place_order): what the row may hold is cleared
        (S.PENDING, 2, False, (S.PENDING, 2, False, E.ACME_TEMPORARY)),
        (S.RENEWING, 2, True, (S.RENEWING, 2, True, E.ACME_TEMPORARY)),
    ],
)
def test_an_uncharged_attempt_keeps_the_budget_and_its_known_order(
    status: S, retries: int, has_order: bool, expected: tuple[S, int, bool, ErrorCode]
) -> None:
    outcome = decide_outcome(status, retries, has_order, E.ACME_TEMPORARY, charged=False)
    assert (outcome.status, outcome.retry_count, outcome.keep_order, outcome.error_code) == expected
    charged = decide_outcome(status, retries, has_order, E.ACME_TEMPORARY)
    assert (charged.status, charged.retry_count) == (S.FAILED, 3)


def test_a_timed_out_step_is_a_lost_worker_and_an_error_is_not() -> None:
    def failed(cause: BaseException) -> ActivityError:
        err = ActivityError(
            "activity failed", scheduled_event_id=1, started_event_id=2, identity="w",
            activity_type="validate_order", activity_id="1", retry_state=None,
        )
        err.__cause__ = cause
        return err

    heartbeat = TemporalTimeout(
        "activity Heartbeat timeout", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[]
    )
    timed_out = failure_of(failed(heartbeat))
    assert (timed_out.code, timed_out.lost) == (E.ACME_TEMPORARY, True)
    assert timed_out.message == "validate_order failed: activity Heartbeat timeout"
    crashed = failure_of(failed(ApplicationError("boom", type="RuntimeError")))
    assert (crashed.code, crashed.lost) == (E.ACME_TEMPORARY, False)
    answered = failure_of(failed(ApplicationError("503", type="ACME_TEMPORARY")))
    assert (answered.code, answered.lost) == (E.ACME_TEMPORARY, False)


def test_code_sets() -> None:
    assert RECHECK_CODES == DNS_CODES | {E.HTTP01_UNREACHABLE, E.DNS01_UPDATE, E.DNS01_NOT_VISIBLE}
    assert DNS_CODES == {E.DNS_CNAME, E.DNS_CAA, E.DNS_DELEGATION, E.DNS_PERSIST, E.OWNERSHIP_UNVERIFIED}
    assert TERMINAL_CODES == {E.ACME_REJECTED}
    assert not retries_automatically(E.ACME_REJECTED)
    assert retries_automatically(E.ACME_FAILED) and retries_automatically(None)


def test_dns_recheck_starts_at_initial_and_caps() -> None:
    policy = ProvisioningPolicy(dns_recheck_initial_seconds=60, dns_recheck_max_seconds=3600)
    assert [dns_recheck_delay(n, policy) for n in (1, 2, 3, 7, 8, 100)] == [
        60, 120, 240, 3600, 3600, 3600
    ]


def test_failure_backoff_doubles_and_caps() -> None:
    policy = ProvisioningPolicy(failure_backoff_initial_seconds=900, failure_backoff_max_seconds=3000)
    assert [failure_backoff(n, policy) for n in (1, 2, 3)] == [900, 1800, 3000]


def test_order_poll_delay_honours_retry_after() -> None:
    assert [order_poll_delay(n, None) for n in (0, 1, 2, 10)] == [1, 2, 4, 60]
    assert order_poll_delay(0, 30) == 30
    assert order_poll_delay(5, 3) == 32
