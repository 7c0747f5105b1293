"""Classification of CA failures into error codes (docs/lifecycle.md, "Statuses and errors"), with Retry-After kept."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
import requests
from acme import messages

from certflow.acme.network import HttpStatusError, classify_acme_failure, parse_retry_after
from certflow.errors import ErrorCode

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def _problem(typ: str, status: int, retry_after: str | None = None) -> messages.Error:
    err: messages.Error = messages.Error.from_json({"type": typ, "detail": "d", "status": status})
    err.http_status = status
    err.retry_after = retry_after
    return err


def test_retry_after_forms() -> None:
    assert parse_retry_after("120", NOW) == 120
    assert parse_retry_after(format_datetime(NOW + timedelta(minutes=5), usegmt=True), NOW) == 300
    assert parse_retry_after(format_datetime(NOW - timedelta(minutes=5), usegmt=True), NOW) == 0
    assert parse_retry_after("soon", NOW) is None
    assert parse_retry_after(None, NOW) is None
    assert parse_retry_after("0", NOW) == 0


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (_problem("urn:ietf:params:acme:error:rateLimited", 429, "60"), ErrorCode.ACME_RATE_LIMITED),
        (_problem("urn:ietf:params:acme:error:RATELIMITED", 403), ErrorCode.ACME_RATE_LIMITED),
        (HttpStatusError(429, None, ""), ErrorCode.ACME_RATE_LIMITED),
        (HttpStatusError(503, "30", "busy"), ErrorCode.ACME_RATE_LIMITED),
        (HttpStatusError(503, None, "busy"), ErrorCode.ACME_TEMPORARY),
        (_problem("urn:ietf:params:acme:error:unauthorized", 403), ErrorCode.ACME_INVALID_ORDER),
        (_problem("urn:ietf:params:acme:error:malformed", 401), ErrorCode.ACME_INVALID_ORDER),
        # rate limit wins over 401
        (_problem("urn:ietf:params:acme:error:rateLimited", 401), ErrorCode.ACME_RATE_LIMITED),
        # the CA's verdict (docs/lifecycle.md, "Statuses and errors"): terminal, or ACME_CAA
        (_problem("urn:ietf:params:acme:error:rejectedIdentifier", 400), ErrorCode.ACME_REJECTED),
        (_problem("urn:ietf:params:acme:error:unsupportedIdentifier", 400), ErrorCode.ACME_REJECTED),
        (_problem("urn:ietf:params:acme:error:badCSR", 400), ErrorCode.ACME_REJECTED),
        (_problem("urn:ietf:params:acme:error:invalidProfile", 400), ErrorCode.ACME_REJECTED),
        (_problem("urn:ietf:params:acme:error:externalAccountRequired", 401), ErrorCode.ACME_REJECTED),
        (_problem("urn:ietf:params:acme:error:caa", 403), ErrorCode.ACME_CAA),
        (_problem("urn:ietf:params:acme:error:alreadyReplaced", 409), ErrorCode.ACME_INVALID_ORDER),
        (_problem("urn:ietf:params:acme:error:badNonce", 400), ErrorCode.ACME_TEMPORARY),
        (_problem("urn:ietf:params:acme:error:serverInternal", 500), ErrorCode.ACME_TEMPORARY),
        (requests.ConnectionError("reset"), ErrorCode.ACME_TEMPORARY),
        (HttpStatusError(500, None, "oops"), ErrorCode.ACME_TEMPORARY),
    ],
)
def test_classification(exc: Exception, code: ErrorCode) -> None:
    assert classify_acme_failure(exc).code is code


@pytest.mark.parametrize(
    ("exc", "unreachable"),
    [
        (requests.ConnectionError("refused"), True),
        (requests.Timeout("read timed out"), True),
        (HttpStatusError(502, None, "bad gateway"), True),
        (HttpStatusError(504, None, "gateway timeout"), True),
        (HttpStatusError(503, None, "busy"), True),
        (HttpStatusError(503, "30", "busy"), False),  # the CA answered: a rate limit
        (HttpStatusError(500, None, "oops"), False),  # the CA answered, wrongly
        (_problem("urn:ietf:params:acme:error:serverInternal", 500), False),
        (_problem("urn:ietf:params:acme:error:badNonce", 400), False),
    ],
)
def test_unreachable_is_no_answer_at_all(exc: Exception, unreachable: bool) -> None:
    """What counts toward falling back to another issuer after the unreachable setting."""
    assert classify_acme_failure(exc).unreachable is unreachable


def test_rate_limit_carries_its_data() -> None:
    err = classify_acme_failure(_problem("urn:ietf:params:acme:error:rateLimited", 429, "90"))
    assert err.retry_after_seconds == 90
    assert err.http_status == 429
    assert err.problem_type.endswith(":rateLimited")
    assert err.non_retryable
    details = err.details()
    assert details["code"] == "ACME_RATE_LIMITED" and details["retry_after_seconds"] == 90
    # no anchor in the detail: the account, the safe default
    assert details["limit_scope"] == "account" and details["limit_anchor"] is None
    assert details["paused"] is False and details["unpause_url"] is None


def test_rate_limit_scope_comes_from_the_anchor() -> None:
    err: messages.Error = messages.Error.from_json(
        {
            "type": "urn:ietf:params:acme:error:rateLimited",
            "detail": 'too many certificates (50) already issued for "example.com" in the last'
            " 168h0m0s, retry after 2026-11-30 12:00:00 UTC: see"
            " https://letsencrypt.org/docs/rate-limits/#new-certificates-per-registered-domain",
            "status": 429,
        }
    )
    err.http_status, err.retry_after = 429, "3600"
    classified = classify_acme_failure(err)
    assert classified.limit_scope == "registered_domain"
    assert classified.limit_anchor == "new-certificates-per-registered-domain"
    assert classified.limit_name == "CertificatesPerDomain"


def test_non_rate_limits_carry_no_scope() -> None:
    err = classify_acme_failure(_problem("urn:ietf:params:acme:error:serverInternal", 500))
    assert err.limit_scope is None and err.limit_anchor is None and not err.paused


def test_temporary_is_retryable_with_its_retry_after() -> None:
    err = classify_acme_failure(_problem("urn:ietf:params:acme:error:serverInternal", 500, "2"))
    assert not err.non_retryable
    assert err.next_retry_delay == timedelta(seconds=2)


def test_subproblems_are_kept() -> None:
    exc = messages.Error.from_json(
        {
            "type": "urn:ietf:params:acme:error:rejectedIdentifier",
            "detail": "d",
            "subproblems": [
                {
                    "type": "urn:ietf:params:acme:error:caa",
                    "detail": "CAA forbids",
                    "identifier": {"type": "dns", "value": "a.example"},
                }
            ],
        }
    )
    err = classify_acme_failure(exc)
    assert err.code is ErrorCode.ACME_REJECTED
    assert err.subproblems == [
        {"type": "urn:ietf:params:acme:error:caa", "detail": "CAA forbids", "identifier": "a.example"}
    ]
