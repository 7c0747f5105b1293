"""What the CA's problem documents mean: the typed error
(:class:`~certflow.errors.AcmeProblemError`) for a CA answer, both tables applied.

1. **Rate-limit scopes** (docs/rate-limits.md, ``rate_limits``): which part of our traffic a
   ``rateLimited`` answer holds back — the whole account, one registered domain,
   or one hostname.
2. **Refusals** (docs/lifecycle.md, "Statuses and errors", ``refusals``): problem type → error code
   and what the outcome table does with it.

Pure functions over plain data (problem type, detail, HTTP status, Retry-After
seconds, subproblems), no I/O, matching Boulder's (letsencrypt/boulder) strings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from certflow.acme.rate_limits import RateLimit, is_rate_limited, rate_limit_for
from certflow.acme.refusals import (
    INVALID,
    LIMITED,
    TEMPORARY,
    VALIDATION_FAILURES,
    Refusal,
    problem_suffix,
    refusal_for,
)
from certflow.errors import AcmeProblemError, ErrorCode
from certflow.models import LimitScope

__all__ = ["challenge_failure", "problem_error"]


# Boulder answers an order URL of another account (or none) with malformed, not
# unauthorized (wfe2/wfe.go GetOrder / FinalizeOrder): 404 "No order for ID %d",
# 404 "No order found for account ID %d", 400 "Mismatched account ID". Like a 401,
# the order is not ours to poll: a new order.
_NOT_OUR_ORDER_RE = re.compile(r"\bNo order (found )?for (account )?ID\b|\bMismatched account ID\b")


def _not_our_order(suffix: str, detail: str, http_status: int | None) -> bool:
    if http_status == 401:
        return True
    return suffix in ("malformed", "") and bool(_NOT_OUR_ORDER_RE.search(detail))


def _message(
    refusal: Refusal, suffix: str, detail: str, challenge: bool, limit: RateLimit | None
) -> str:
    code = refusal.code
    detail = detail or "no detail"
    if limit is not None:
        if limit.paused:
            where = f"unpause at {limit.unpause_url}" if limit.unpause_url else detail
            return f"paused by the CA (too many consecutive failed authorizations); {where}"
        scope = {
            LimitScope.ACCOUNT: "this account",
            LimitScope.REGISTERED_DOMAIN: "this registered domain",
            LimitScope.HOSTNAME: "this hostname",
        }[limit.scope]
        return f"the CA is rate-limiting {scope}: {detail}"
    if code is ErrorCode.ACME_REJECTED:
        return f"the CA refused to issue for this hostname: {detail}"
    if code is ErrorCode.ACME_CAA:
        return f"the CA's CAA check refused although ours allowed: {detail}"
    if code is ErrorCode.ACME_INVALID_ORDER:
        if challenge or suffix in VALIDATION_FAILURES - {"unauthorized"}:
            return f"the CA could not validate the domain: {detail}"
        return f"the CA refused the order: {detail}"
    return f"CA request failed: {detail}"


def problem_error(
    problem_type: str,
    detail: str,
    *,
    http_status: int | None = None,
    retry_after_seconds: float | None = None,
    subproblems: Sequence[Mapping[str, Any]] = (),
    challenge: bool = False,
) -> AcmeProblemError:
    """The typed error for a CA answer (both tables applied).

    ``challenge=True`` for a challenge's or an invalid order's error: the order is
    dead, so what table 2 does not name is ACME_INVALID_ORDER, and a failed
    validation's message says what the CA found. Otherwise the order docs/lifecycle.md gives: a
    rate limit first (with its scope), then table 2, then an order that is not ours
    (401, or Boulder's malformed "No order for ID …") as ACME_INVALID_ORDER, then
    ACME_TEMPORARY. (What a refused ``replaces`` means is
    :func:`~certflow.acme.refusals.replaces_refusal`'s, asked by the order that
    sent it.)
    """
    detail = detail or problem_type
    suffix = problem_suffix(problem_type)
    limit: RateLimit | None = None
    if not challenge and is_rate_limited(problem_type, http_status, retry_after_seconds):
        refusal = LIMITED
        limit = rate_limit_for(detail, http_status, problem_type)
    else:
        refusal = refusal_for(problem_type, subproblems, challenge=challenge)
        if refusal is TEMPORARY and _not_our_order(suffix, detail, http_status):
            refusal = INVALID
    message = _message(refusal, suffix, detail, challenge, limit)
    return AcmeProblemError(
        code=refusal.code,
        message=message,
        problem_type=problem_type,
        detail=detail,
        http_status=http_status,
        retry_after_seconds=retry_after_seconds,
        subproblems=[dict(sp) for sp in subproblems],
        limit_scope=str(limit.scope) if limit else None,
        limit_anchor=limit.anchor if limit else None,
        limit_name=limit.name if limit else None,
        paused=limit.paused if limit else False,
        unpause_url=limit.unpause_url if limit else None,
    )


def challenge_failure(
    problem: Mapping[str, Any] | None, default_detail: str = "the order became invalid"
) -> AcmeProblemError:
    """The typed error for a challenge's ``error`` (or an invalid order's), as the CA
    sent it in JSON: e.g. ``caa`` → ACME_CAA, ``rejectedIdentifier`` → ACME_REJECTED,
    ``connection`` → ACME_INVALID_ORDER with the CA's detail (which address, what
    answered)."""
    problem = problem or {}
    return problem_error(
        str(problem.get("type") or ""),
        str(problem.get("detail") or default_detail),
        subproblems=list(problem.get("subproblems") or []),
        challenge=True,
    )
