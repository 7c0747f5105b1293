"""Table 2 of what the CA's problem documents mean (``problems`` applies both):
refusals (docs/lifecycle.md, "Statuses and errors"), a problem type → an error code and what the
outcome table does with it; and what a refused ``replaces`` means for a renewal
(RFC 9773 §5). Pure functions over plain data, no I/O.

The strings matched here are Boulder's (letsencrypt/boulder): the problem types
in ``probs/probs.go``, the ``replaces`` refusals in ``wfe2/wfe.go``
(``validateReplacementOrder``, ``orderMatchesReplacement``, ``parseARICertID``).
Pebble's ``replaces`` refusals (``wfe/wfe.go``) are recognised too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from certflow.errors import ErrorCode

__all__ = [
    "CAA",
    "INVALID",
    "LIMITED",
    "REFUSALS",
    "REJECTED",
    "TEMPORARY",
    "VALIDATION_FAILURES",
    "Effect",
    "Refusal",
    "ReplacesRefusal",
    "problem_suffix",
    "refusal_for",
    "replaces_refusal",
]


def problem_suffix(problem_type: str) -> str:
    """The RFC 8555 error name, lower-cased: ``urn:ietf:params:acme:error:rateLimited``
    → ``ratelimited``; ``""`` for no type."""
    return problem_type.rsplit(":", 1)[-1].strip().lower() if problem_type else ""


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


# Named, not private: problems.problem_error tells them apart by identity.
REJECTED = Refusal(ErrorCode.ACME_REJECTED, Effect.TERMINAL)
CAA = Refusal(ErrorCode.ACME_CAA, Effect.NEW_ORDER)
INVALID = Refusal(ErrorCode.ACME_INVALID_ORDER, Effect.NEW_ORDER)
LIMITED = Refusal(ErrorCode.ACME_RATE_LIMITED, Effect.COOLDOWN)
TEMPORARY = Refusal(ErrorCode.ACME_TEMPORARY, Effect.RETRY)

REFUSALS: Mapping[str, Refusal] = {
    # the CA's verdict on the name or the request: terminal
    "rejectedidentifier": REJECTED,
    "unsupportedidentifier": REJECTED,
    "badcsr": REJECTED,
    "invalidprofile": REJECTED,
    # RFC 8555 §7.3.4: the CA registers no account without External Account Binding
    "externalaccountrequired": REJECTED,
    # CAA forbids the CA (va/caa.go, or ra/ra.go's recheck at finalize) although our
    # own check allowed: Boulder counts it as a failed authorization (ra.go
    # countFailedValidations), so it counts in the budget, and the workflow orders
    # nothing more from that CA until its reading of CAA changes
    "caa": CAA,
    # a failed validation (va/va.go detailedError, va/http.go); a top-level
    # unauthorized is an order of another account: a new order either way
    "unauthorized": INVALID,
    "connection": INVALID,
    "incorrectresponse": INVALID,
    "dns": INVALID,
    "tls": INVALID,
    # RFC 9773 §5: a renewal retries once without `replaces` (replaces_refusal)
    "alreadyreplaced": INVALID,
    "ratelimited": LIMITED,
    "badnonce": TEMPORARY,
    "serverinternal": TEMPORARY,
}

# Which subproblem decides a compound answer: the CA's verdict first.
_PRECEDENCE = (REJECTED, CAA, INVALID, LIMITED, TEMPORARY)
VALIDATION_FAILURES = frozenset({"unauthorized", "connection", "incorrectresponse", "dns", "tls"})


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
        return INVALID if challenge else TEMPORARY
    if challenge and found in (LIMITED, TEMPORARY):
        return INVALID
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
