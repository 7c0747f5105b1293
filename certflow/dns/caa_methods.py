"""CAA's verdict for each validation method, as ``check`` and ``status`` show it
beside each method's readiness: RFC 8657 ``validationmethods`` can allow one
method and refuse another, and the CA judges the one that validates (Boulder's
va/caa.go checkCAA, with the authorization's challenge type)."""

from __future__ import annotations

from collections.abc import Sequence

from certflow.dns.caa_climb import CaaLookup, find_caa_set
from certflow.dns.caa_verdict import CaaIssuer, caa_allows
from certflow.errors import DnsCheckError


async def caa_by_method(
    hostname: str,
    issuers: Sequence[tuple[str, CaaIssuer]],
    lookup: CaaLookup,
    methods: Sequence[str],
) -> dict[str, tuple[bool | None, str]]:
    """For each method: (allowed, why). Allowed when CAA lets one of ``issuers``
    (name, CA) issue with it, naming those that may; else the first CA's refusal.
    One CAA walk for all; (None, the error) when it fails."""
    wildcard = hostname.startswith("*.")
    try:
        found = await find_caa_set(hostname[2:] if wildcard else hostname, lookup)
    except DnsCheckError as err:
        return {m: (None, err.message) for m in methods}
    verdicts: dict[str, tuple[bool | None, str]] = {}
    for method in methods:
        judged = [
            (name, caa_allows(found, issuer, wildcard=wildcard, method=method)) for name, issuer in issuers
        ]
        allowed = [(name, verdict) for name, verdict in judged if verdict.allowed]
        if allowed:
            names = ", ".join(name for name, _ in allowed)
            verdicts[method] = (True, f"{allowed[0][1].reason} ({names})")
        else:
            verdicts[method] = (False, judged[0][1].reason)
    return verdicts
