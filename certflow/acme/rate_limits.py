"""Table 1 of what the CA's problem documents mean (``problems`` applies both):
which part of our traffic a rate-limit answer holds back (docs/rate-limits.md) — the whole
account, one registered domain, or one hostname.

It is read from the anchor of the
``see https://letsencrypt.org/docs/rate-limits/#<anchor>`` link Let's Encrypt
ends every rate-limit detail with, with a fallback on Boulder's wording and the
account (the safe default) when nothing matches. Pure functions over plain data,
no I/O.

The strings matched here are Boulder's (letsencrypt/boulder): the anchors in
``errors/errors.go``, the rate-limit details in ``ratelimits/limiter.go``
(``Decision.Result``), the paused-identifier detail in ``wfe2/wfe.go``
(``NewOrder``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from certflow.acme.refusals import problem_suffix
from certflow.models import LimitScope
from certflow.store.cooldowns import OVERALL_REQUESTS

__all__ = [
    "LIMIT_ANCHORS",
    "PAUSED_LIMIT",
    "UNKNOWN_LIMIT",
    "RateLimit",
    "is_rate_limited",
    "limit_anchor",
    "rate_limit_for",
    "unpause_url",
]


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
    """docs/rate-limits.md: a ``rateLimited`` problem (any case), HTTP 429, or a 503 with Retry-After."""
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
