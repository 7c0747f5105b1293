"""dns-persist-01 (draft-ietf-acme-dns-persist): one TXT the customer publishes once.

``_validation-persist.<host> TXT "<issuer-domain>; accounturi=<our account URL>"``
(``; policy=wildcard`` for a wildcard or its subdomains) authorizes every future
issuance by that CA for that account, and certflow writes nothing in DNS. The
record is judged here as the CA will judge it: issue-value syntax (RFC 8659 §4),
the issuer domain one of the CA's (normalized as the draft says), ``accounturi``
exactly ours, ``persistUntil`` not past, unknown parameters ignored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone

from certflow.dns.caa_records import parse_issue_value
from certflow.dns.dns01 import base_name
from certflow.dns.lookup import DnsLookupError
from certflow.errors import DnsCheckError, ErrorCode
from certflow.models import DnsRecord

PERSIST_LABEL = "_validation-persist"

TxtLookup = Callable[[str], Awaitable[Sequence[str]]]
"""The TXT strings (each record's character-strings joined) at a name, through the
resolver, CNAMEs followed."""


def persist_name(hostname: str) -> str:
    """The Authorization Domain Name: ``_validation-persist.<base name>``."""
    return f"{PERSIST_LABEL}.{base_name(hostname)}"


def persist_record(hostname: str, issuer_domain: str, account_uri: str) -> DnsRecord:
    """The record the customer publishes for one CA and our account there."""
    value = f"{issuer_domain}; accounturi={account_uri}"
    if hostname.startswith("*."):
        value += "; policy=wildcard"
    return DnsRecord(name=persist_name(hostname), type="TXT", value=value)


def _normalized(domain: str) -> str:
    """The draft's normalization of an issuer domain (A-labels are all it may hold
    here: the issue-value grammar is ASCII): lower case, no trailing dot."""
    return domain.lower().rstrip(".")


def judge(
    records: Sequence[str],
    hostname: str,
    issuer_domains: Sequence[str],
    account_uri: str | None,
    now: datetime | None = None,
) -> str | None:
    """Why no record authorizes this CA and account for ``hostname`` (None: one does).

    Records for other issuer domains are ignored, as the CA ignores them; of ours,
    the first valid one wins."""
    now = now or datetime.now(timezone.utc)
    ours = {_normalized(d) for d in issuer_domains}
    wanted = " or ".join(sorted(ours))
    problems: list[str] = []
    for text in records:
        value = parse_issue_value(text)
        if value is None:
            problems.append(f"{text!r} is not an issue-value (RFC 8659 §4)")
            continue
        if _normalized(value.issuer) not in ours:
            continue
        tags = [tag.lower() for tag, _ in value.params]
        if len(tags) != len(set(tags)):
            problems.append(f"{text!r} repeats a parameter")
            continue
        params = {tag.lower(): param for tag, param in value.params}
        uri = params.get("accounturi")
        if uri is None:
            problems.append(f"{text!r} has no accounturi")
            continue
        if account_uri is None:
            problems.append("our ACME account URL at this CA is not known yet")
            continue
        if uri != account_uri:
            problems.append(f"{text!r} names another account (ours is {account_uri})")
            continue
        until = params.get("persistuntil")
        if until is not None:
            if not until.isdigit():
                problems.append(f"{text!r}: persistUntil is not a UNIX time")
                continue
            if int(until) < now.timestamp():
                when = datetime.fromtimestamp(int(until), timezone.utc)
                problems.append(f"{text!r} expired at {when:%Y-%m-%d %H:%M} UTC (persistUntil)")
                continue
        if hostname.startswith("*.") and params.get("policy", "").lower() != "wildcard":
            problems.append(f"{text!r} lacks policy=wildcard, which a wildcard needs")
            continue
        return None
    if problems:
        return "; ".join(problems)
    return f"no record for {wanted}"


async def check_persist(
    hostname: str,
    issuer_domains: Sequence[str],
    account_uri: str | None,
    lookup_txt: TxtLookup,
) -> str:
    """Raise ``DnsCheckError(DNS_PERSIST)`` unless a persist record authorizes this CA
    and account; what was found when one does."""
    name = persist_name(hostname)
    try:
        records = await lookup_txt(name)
    except DnsLookupError as err:
        raise DnsCheckError(
            ErrorCode.DNS_PERSIST, f"could not look up the TXT records of {name}: {err.reason}"
        ) from err
    reason = judge(records, hostname, issuer_domains, account_uri)
    if reason is None:
        return f"{name} authorizes our account"
    expected = (
        persist_record(hostname, issuer_domains[0], account_uri).value
        if issuer_domains and account_uri
        else ""
    )
    raise DnsCheckError(
        ErrorCode.DNS_PERSIST,
        f"{name}: {reason}" + (f"; publish {name} TXT \"{expected}\"" if expected else ""),
        found=list(records),
        expected=expected,
    )
