"""What the CA's problem documents mean.

Two tables, both pure functions over plain data (problem type, detail, HTTP
status, Retry-After seconds, subproblems), no I/O:

1. **Rate-limit scopes** (SPEC §4): which part of our traffic a ``rateLimited``
   answer holds back — the whole account, one registered domain, or one
   hostname — read from the anchor of the
   ``see https://letsencrypt.org/docs/rate-limits/#<anchor>`` link Let's Encrypt
   ends every rate-limit detail with, with a fallback on Boulder's wording and
   the account (the safe default) when nothing matches.
2. **Refusals** (SPEC §4 "More refusals"): problem type → error code and what
   the outcome table does with it.

The strings matched here are Boulder's (letsencrypt/boulder): the anchors in
``errors/errors.go``, the rate-limit details in ``ratelimits/limiter.go``
(``Decision.Result``), the paused-identifier detail in ``wfe2/wfe.go``
(``NewOrder``), the ``replaces`` refusals in ``wfe2/wfe.go``
(``validateReplacementOrder``, ``orderMatchesReplacement``,
``parseARICertID``) and the problem types in ``probs/probs.go``. Pebble's
``replaces`` refusals (``wfe/wfe.go``) are recognised too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from certflow.store.cooldowns import OVERALL_REQUESTS
from certflow.errors import AcmeProblemError, ErrorCode
from certflow.models import LimitScope

__all__ = [
    "LIMIT_ANCHORS",
    "REFUSALS",
    "Effect",
    "LimitScope",
    "RateLimit",
    "Refusal",
    "challenge_failure",
    "is_rate_limited",
    "ReplacesRefusal",
    "replaces_refusal",
    "limit_anchor",
    "problem_error",
    "problem_suffix",
    "rate_limit_for",
    "refusal_for",
    "unpause_url",
]


def problem_suffix(problem_type: str) -> str:
    """The RFC 8555 error name, lower-cased: ``urn:ietf:params:acme:error:rateLimited``
    → ``ratelimited``; ``""`` for no type."""
    return problem_type.rsplit(":", 1)[-1].strip().lower() if problem_type else ""


# --------------------------------------------------------------------------- table 1


@dataclass(frozen=True)
class RateLimit:
    """One rate-limit answer, understood.

    ``anchor`` is the rate-limits page anchor the detail links to (None when it
    links none: the paused identifier, a bare 429 or 503, older details);
    ``name`` is Boulder's name for the limit (``ratelimits/names.go``), or
    ``OverallRequests`` for the load balancers' 503, or ``Unknown``.
    ``paused``: the hostname is paused after too many consecutive failed
    authorizations; waiting does not lift it, only the CA's portal does, at
    ``unpause_url`` when the detail gives one.
    """

    scope: LimitScope
    anchor: str | None
    name: str
    paused: bool = False
    unpause_url: str | None = None


_ACCOUNT = LimitScope.ACCOUNT
_DOMAIN = LimitScope.REGISTERED_DOMAIN
_HOST = LimitScope.HOSTNAME

PAUSED_LIMIT = "FailedAuthorizationsForPausingPerDomainPerAccount"
UNKNOWN_LIMIT = "Unknown"

LIMIT_ANCHORS: Mapping[str, tuple[LimitScope, str]] = {
    # boulder errors/errors.go (RegistrationsPerIPAddressError, …PerIPv6RangeError,
    # NewOrdersPerAccountError; LimitOverrideRequestsPerIPAddressError links the
    # registrations anchor since #8596)
    "new-registrations-per-ip-address": (_ACCOUNT, "NewRegistrationsPerIPAddress"),
    "new-registrations-per-ipv6-range": (_ACCOUNT, "NewRegistrationsPerIPv6Range"),
    "new-orders-per-account": (_ACCOUNT, "NewOrdersPerAccount"),
    "limit-override-requests-per-ip-address": (_ACCOUNT, "LimitOverrideRequestsPerIPAddress"),
    # the load balancers' 503 (rate-limits page, "Overall Requests Limit"; older page
    # revisions named the anchor overall-requests)
    "overall-requests": (_ACCOUNT, OVERALL_REQUESTS),
    "overall-requests-limit": (_ACCOUNT, OVERALL_REQUESTS),
    # CertificatesPerDomainError (also CertificatesPerDomainPerAccount overrides)
    "new-certificates-per-registered-domain": (_DOMAIN, "CertificatesPerDomain"),
    # CertificatesPerFQDNSetError: …-identifiers since #8291, …-hostnames before
    "new-certificates-per-exact-set-of-identifiers": (_HOST, "CertificatesPerFQDNSet"),
    "new-certificates-per-exact-set-of-hostnames": (_HOST, "CertificatesPerFQDNSet"),
    # FailedAuthorizationsPerDomainPerAccountError: …-per-identifier-… since #8596
    "authorization-failures-per-identifier-per-account": (
        _HOST,
        "FailedAuthorizationsPerDomainPerAccount",
    ),
    "authorization-failures-per-hostname-per-account": (
        _HOST,
        "FailedAuthorizationsPerDomainPerAccount",
    ),
    # the paused identifier (its detail links the portal, not the page)
    "consecutive-authorization-failures-per-identifier-per-account": (_HOST, PAUSED_LIMIT),
    "consecutive-authorization-failures-per-hostname-per-account": (_HOST, PAUSED_LIMIT),
}

_ANCHOR_RE = re.compile(r"letsencrypt\.org/docs/rate-limits/?#([A-Za-z0-9_-]+)", re.IGNORECASE)

# Boulder's wording, for details without a (known) anchor. Checked in order: the
# exact-set limit before the per-domain one, whose wording it shares.
_TEXT_RULES: tuple[tuple[re.Pattern[str], LimitScope, str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), scope, name)
    for pattern, scope, name in (
        (r"too many new orders", _ACCOUNT, "NewOrdersPerAccount"),
        (r"too many new registrations .*/48 subnet", _ACCOUNT, "NewRegistrationsPerIPv6Range"),
        (r"too many (new )?registrations", _ACCOUNT, "NewRegistrationsPerIPAddress"),
        (r"too many override request", _ACCOUNT, "LimitOverrideRequestsPerIPAddress"),
        (
            r"(exact|same) set of (identifiers|hostnames|domains|names)",
            _HOST,
            "CertificatesPerFQDNSet",
        ),
        (r"too many certificates\b.*\balready issued for", _DOMAIN, "CertificatesPerDomain"),
        (
            r"too many failed (authorizations|validations)",
            _HOST,
            "FailedAuthorizationsPerDomainPerAccount",
        ),
    )
)

# wfe2/wfe.go NewOrder: "Your account is temporarily prevented from requesting
# certificates for %s and possibly others. Please visit: %s" (probs.Paused, a
# rateLimited problem, 429, no Retry-After).
_PAUSED_RE = re.compile(
    r"temporarily prevented from requesting certificates"
    r"|consecutive (failed )?authori[sz]ation(s| failures)"
    r"|\b(is|are|been) paused\b",
    re.IGNORECASE,
)
_UNPAUSE_URL_RE = re.compile(r"https?://[^\s\"'<>]*/unpause\?[^\s\"'<>]*", re.IGNORECASE)


def limit_anchor(detail: str) -> str | None:
    """The rate-limits page anchor a detail links to, lower-cased, or None."""
    match = _ANCHOR_RE.search(detail or "")
    return match.group(1).lower() if match else None


def unpause_url(detail: str) -> str | None:
    """The CA portal link a paused-identifier detail carries
    (``…/sfe/v1/unpause?jwt=…``), or None."""
    match = _UNPAUSE_URL_RE.search(detail or "")
    return match.group(0).rstrip(".,;)") if match else None


def is_rate_limited(
    problem_type: str, http_status: int | None, retry_after_seconds: float | None
) -> bool:
    """SPEC §4: a ``rateLimited`` problem (any case), HTTP 429, or a 503 with Retry-After."""
    return (
        problem_suffix(problem_type) == "ratelimited"
        or http_status == 429
        or (http_status == 503 and retry_after_seconds is not None)
    )


def rate_limit_for(
    detail: str, http_status: int | None = None, problem_type: str = ""
) -> RateLimit:
    """Table 1: the scope of a rate-limit answer.

    In order: the paused identifier (HOSTNAME, with its unpause link); a 503
    that is no ``rateLimited`` problem (the overall-requests limit: ACCOUNT);
    the anchor of the rate-limits link; Boulder's wording; the account.
    """
    detail = detail or ""
    if _PAUSED_RE.search(detail):
        return RateLimit(
            _HOST, limit_anchor(detail), PAUSED_LIMIT, paused=True, unpause_url=unpause_url(detail)
        )
    if http_status == 503 and problem_suffix(problem_type) != "ratelimited":
        return RateLimit(_ACCOUNT, limit_anchor(detail), OVERALL_REQUESTS)
    anchor = limit_anchor(detail)
    if anchor is not None and anchor in LIMIT_ANCHORS:
        scope, name = LIMIT_ANCHORS[anchor]
        return RateLimit(scope, anchor, name, paused=name == PAUSED_LIMIT)
    for pattern, scope, name in _TEXT_RULES:
        if pattern.search(detail):
            return RateLimit(scope, anchor, name)
    return RateLimit(_ACCOUNT, anchor, UNKNOWN_LIMIT)


# --------------------------------------------------------------------------- table 2


class Effect(StrEnum):
    """What the outcome table (workflows/policy.py) does with a code."""

    TERMINAL = "terminal"  # FAILED at once with the CA's detail; no automatic retry
    RECHECK = "recheck"  # like the DNS codes: PENDING, budget untouched, rechecked on a backoff
    NEW_ORDER = "new_order"  # retry count +1, order cleared, a new order next time
    COOLDOWN = "cooldown"  # budget untouched; no new order in the limit's scope until it ends
    RETRY = "retry"  # retry count +1, the order kept


@dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    effect: Effect


_REJECTED = Refusal(ErrorCode.ACME_REJECTED, Effect.TERMINAL)
_CAA = Refusal(ErrorCode.ACME_CAA, Effect.NEW_ORDER)
_INVALID = Refusal(ErrorCode.ACME_INVALID_ORDER, Effect.NEW_ORDER)
_LIMITED = Refusal(ErrorCode.ACME_RATE_LIMITED, Effect.COOLDOWN)
_TEMPORARY = Refusal(ErrorCode.ACME_TEMPORARY, Effect.RETRY)

REFUSALS: Mapping[str, Refusal] = {
    # the CA's verdict on the name or the request: terminal
    "rejectedidentifier": _REJECTED,
    "unsupportedidentifier": _REJECTED,
    "badcsr": _REJECTED,
    "invalidprofile": _REJECTED,
    # RFC 8555 §7.3.4: the CA registers no account without External Account Binding
    "externalaccountrequired": _REJECTED,
    # CAA forbids the CA (va/caa.go, or ra/ra.go's recheck at finalize) although our
    # own check allowed: Boulder counts it as a failed authorization (ra.go
    # countFailedValidations), so it counts in the budget, and the workflow orders
    # nothing more from that CA until its reading of CAA changes
    "caa": _CAA,
    # a failed validation (va/va.go detailedError, va/http.go); a top-level
    # unauthorized is an order of another account: a new order either way
    "unauthorized": _INVALID,
    "connection": _INVALID,
    "incorrectresponse": _INVALID,
    "dns": _INVALID,
    "tls": _INVALID,
    # RFC 9773 §5: a renewal retries once without `replaces` (replaces_refusal)
    "alreadyreplaced": _INVALID,
    "ratelimited": _LIMITED,
    "badnonce": _TEMPORARY,
    "serverinternal": _TEMPORARY,
}

# Which subproblem decides a compound answer: the CA's verdict first.
_PRECEDENCE = (_REJECTED, _CAA, _INVALID, _LIMITED, _TEMPORARY)
_VALIDATION_FAILURES = frozenset({"unauthorized", "connection", "incorrectresponse", "dns", "tls"})


def refusal_for(
    problem_type: str,
    subproblems: Sequence[Mapping[str, Any]] = (),
    *,
    challenge: bool = False,
) -> Refusal:
    """Table 2: the code and effect of a problem type.

    The top-level type decides when the table names it; otherwise (``compound``,
    ``malformed``, none) the most decisive subproblem type does. What no row
    names is ACME_TEMPORARY for an answer to a request, and ACME_INVALID_ORDER
    for a challenge's or invalid order's error (``challenge=True``): that order
    is dead whatever the reason.
    """
    found = REFUSALS.get(problem_suffix(problem_type))
    if found is None and subproblems:
        named = {REFUSALS.get(problem_suffix(str(sp.get("type") or ""))) for sp in subproblems}
        found = next((r for r in _PRECEDENCE if r in named), None)
    if found is None:
        return _INVALID if challenge else _TEMPORARY
    if challenge and found in (_LIMITED, _TEMPORARY):
        return _INVALID
    return found


# Boulder: "Could not validate ARI 'replaces' field :: …" (wfe2/wfe.go NewOrder) with
# "… which already has a replacement order" (409 alreadyReplaced), "request included
# `replaces` field, but no current certificate with serial %q exists" (404),
# "requester account did not request the certificate being replaced by this order"
# (403 unauthorized), "Invalid path" / "identifiers in this order do not match any
# identifiers in the certificate being replaced" (400 malformed). Pebble: "parsing
# ARI CertID failed", "could not find an order for the given certificate" (500),
# "at least one identifier in the new order and existing order must match" (500).
_REPLACES_RE = re.compile(
    r"['`]replaces['`]"
    r"|\breplaces field\b"
    r"|already has a replacement order"
    r"|certificate being replaced"
    r"|ARI CertID"
    r"|could not find an order for the given certificate"
    r"|in the new order and existing order must match",
    re.IGNORECASE,
)


class ReplacesRefusal(StrEnum):
    """How a renewal goes on when the CA refused a new order that named the
    certificate it replaces (RFC 9773 §5 ``replaces``), as Boulder scopes it."""

    CERTIFICATE = "certificate"
    """403, 404, 409 (another account's, unknown, already replaced): this renewal goes
    once more without ``replaces``; the next certificate still sends it."""
    FIELD = "field"
    """400: once more without; when that goes through and the CA said ``malformed``
    on our well-formed certID, the CA rejects the field itself: renewals go without
    it for a day, then it is sent again."""
    TEMPORARY = "temporary"
    """5xx naming ``replaces`` (Boulder's 500 "Could not validate ARI 'replaces'
    field"): temporary, retried later with it."""


def replaces_refusal(problem_type: str, detail: str, http_status: int | None) -> ReplacesRefusal | None:
    """What the CA's answer to a new-order that carried ``replaces`` means for it
    (None: not about ``replaces``; handled as any answer). Any 400, 403, 404 or 409
    problem counts — a CA that wants its own certificate identifier answers 404
    ``malformed`` "Certificate not found for certID …", which names no field."""
    suffix = problem_suffix(problem_type)
    if suffix == "ratelimited" or http_status == 429:
        return None
    if http_status is None:  # no status kept: read the type
        http_status = {"alreadyreplaced": 409, "conflict": 409, "unauthorized": 403}.get(
            suffix, 400 if suffix == "malformed" else None
        )
    if http_status in (403, 404, 409) or suffix == "alreadyreplaced":
        return ReplacesRefusal.CERTIFICATE
    if http_status == 400:
        return ReplacesRefusal.FIELD
    if http_status is not None and http_status >= 500 and _REPLACES_RE.search(detail or ""):
        return ReplacesRefusal.TEMPORARY
    return None


# Boulder answers an order URL of another account (or none) with malformed, not
# unauthorized (wfe2/wfe.go GetOrder / FinalizeOrder): 404 "No order for ID %d",
# 404 "No order found for account ID %d", 400 "Mismatched account ID". Like a 401,
# the order is not ours to poll: a new order.
_NOT_OUR_ORDER_RE = re.compile(r"\bNo order (found )?for (account )?ID\b|\bMismatched account ID\b")


def _not_our_order(suffix: str, detail: str, http_status: int | None) -> bool:
    if http_status == 401:
        return True
    return suffix in ("malformed", "") and bool(_NOT_OUR_ORDER_RE.search(detail))


# --------------------------------------------------------------------------- errors


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
            _ACCOUNT: "this account",
            _DOMAIN: "this registered domain",
            _HOST: "this hostname",
        }[limit.scope]
        return f"the CA is rate-limiting {scope}: {detail}"
    if code is ErrorCode.ACME_REJECTED:
        return f"the CA refused to issue for this hostname: {detail}"
    if code is ErrorCode.ACME_CAA:
        return f"the CA's CAA check refused although ours allowed: {detail}"
    if code is ErrorCode.ACME_INVALID_ORDER:
        if challenge or suffix in _VALIDATION_FAILURES - {"unauthorized"}:
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
    validation's message says what the CA found. Otherwise SPEC §4's order: a
    rate limit first (with its scope), then table 2, then an order that is not ours
    (401, or Boulder's malformed "No order for ID …") as ACME_INVALID_ORDER, then
    ACME_TEMPORARY. (What a refused ``replaces`` means is :func:`replaces_refusal`'s,
    asked by the order that sent it.)
    """
    detail = detail or problem_type
    suffix = problem_suffix(problem_type)
    limit: RateLimit | None = None
    if not challenge and is_rate_limited(problem_type, http_status, retry_after_seconds):
        refusal = _LIMITED
        limit = rate_limit_for(detail, http_status, problem_type)
    else:
        refusal = refusal_for(problem_type, subproblems, challenge=challenge)
        if refusal is _TEMPORARY and _not_our_order(suffix, detail, http_status):
            refusal = _INVALID
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
