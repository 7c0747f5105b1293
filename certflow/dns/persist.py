"""dns-persist-01 (draft-ietf-acme-dns-persist): one TXT the customer publishes once.

``_validation-persist.<host> TXT "<issuer-domain>; accounturi=<our account URL>"``
(``; policy=wildcard`` for a wildcard or its subdomains) authorizes every future
issuance by that CA for that account, and certflow writes nothing in DNS.

The record is judged here as Boulder's VA judges it (letsencrypt/boulder
``va/dns_persist.go``), rule for rule; each function below names the Boulder
function it follows:

- :func:`parse_record` is ``parseDNSPersistRecord``: the issuer is what precedes
  the first ``;`` (space and tab trimmed), normalized by
  :func:`normalize_issuer_domain_name` (``core.NormalizeIssuerDomainName``: lower
  case, NFC, IDNA to A-labels, one trailing dot dropped); each parameter
  ``tag=value`` with both sides trimmed, the tag non-empty and compared in lower
  case, the value printable ASCII without ``;`` (any tag's); ``accounturi`` (not
  empty), ``policy`` and ``persistUntil`` (``strconv.ParseInt``: a sign allowed)
  at most once each; unknown tags, hyphenated or repeated, ignored.
- :func:`check_record` is ``checkDNSPersistRecord``: ``accounturi`` exactly the
  expected value, ``policy=wildcard`` (any case) for a wildcard, not after
  ``persistUntil``.
- :func:`judge` is ``validateDNSPersist01``'s loop: records for other issuers and
  malformed records are skipped, the first valid record of ours wins; failing,
  the malformed records naming our issuer are the reason, else the records that
  do not authorize us.

:func:`check_challenge` compares a dns-persist-01 challenge (the values the CA
will compare) with what the record was judged against, before it is accepted.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import idna

from certflow.dns.dns01 import base_name
from certflow.dns.lookup import DnsLookupError
from certflow.errors import CertflowError, DnsCheckError, ErrorCode
from certflow.models import DnsRecord

PERSIST_LABEL = "_validation-persist"

TxtLookup = Callable[[str], Awaitable[Sequence[str]]]
"""The TXT strings (each record's character-strings joined) at a name, through the
resolver, CNAMEs followed."""

_WSP = " \t"
"""RFC 5234 WSP, all Boulder trims (``isWSP``)."""

_INT64 = (-(2**63), 2**63 - 1)
_GO_ZERO_TIME = -62135596800
"""``time.Unix(s, 0)`` of Go's zero ``time.Time`` (year 1): ``persistUntil`` parsed to
it reads as absent (``checkDNSPersistRecord``: ``!params.persistUntil.IsZero()``)."""

_PARSE_INT = re.compile(r"[+-]?[0-9]+")
"""What ``strconv.ParseInt(value, 10, 64)`` takes: a sign, then decimal digits."""

_LDH = re.compile(r"[a-z0-9-]*")


def persist_name(hostname: str) -> str:
    """The Authorization Domain Name: ``_validation-persist.<base name>``."""
    return f"{PERSIST_LABEL}.{base_name(hostname)}"


def persist_record(hostname: str, issuer_domain: str, account_uri: str) -> DnsRecord:
    """The record the customer publishes for one CA and our account there."""
    value = f"{issuer_domain}; accounturi={account_uri}"
    if hostname.startswith("*."):
        value += "; policy=wildcard"
    return DnsRecord(name=persist_name(hostname), type="TXT", value=value)


# -- the issuer domain name ---------------------------------------------------------


def _go_lower(text: str) -> str:
    """Go's ``strings.ToLower``: one rune for one (Python's ``lower`` turns U+0130
    into two, ``i`` and a combining dot; Go gives ``i``)."""
    return "".join("i" if char == "\u0130" else char.lower() for char in text)


def _checked_ldh(label: str) -> str:
    """An ASCII label as x/net/idna's Lookup profile checks it: letters, digits and
    hyphens only (STD3), no hyphen first or last, none in both the 3rd and 4th
    place of a label longer than 4 (its ``validateLabel``, V2 and V3)."""
    if not _LDH.fullmatch(label):
        raise ValueError(f"label {label!r} holds a character other than a letter, digit or hyphen")
    if len(label) > 4 and label[2:4] == "--":
        raise ValueError(f"label {label!r} has hyphens in its 3rd and 4th places")
    if label.startswith("-") or label.endswith("-"):
        raise ValueError(f"label {label!r} starts or ends with a hyphen")
    return label


def _a_label(label: str) -> str:
    """One non-empty label to its A-label, as ``idna.Lookup.ToASCII`` does: an
    ``xn--`` label is decoded and checked (decoding to ASCII it is kept decoded,
    as x/net/idna does before Unicode 16), a U-label checked and encoded."""
    if label.startswith("xn--"):
        try:
            decoded = label[4:].encode("ascii").decode("punycode")
        except (UnicodeError, ValueError) as exc:
            raise ValueError(f"label {label!r} is no valid Punycode") from exc
        if decoded.isascii():
            return _checked_ldh(decoded)
        label = decoded
    elif label.isascii():
        return _checked_ldh(label)
    try:
        return idna.alabel(label).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise ValueError(f"label {label!r}: {exc}") from exc


def normalize_issuer_domain_name(name: str) -> str:
    """An issuer-domain-name as Boulder normalizes it (``core.NormalizeIssuerDomainName``,
    draft-ietf-acme-dns-persist-01 §9.2): lower case, Unicode NFC, A-labels (x/net/idna's
    ``Lookup`` profile: UTS 46 mapping, STD3 characters, the hyphen rules; empty
    labels let through), one trailing dot removed, at most 253 octets. ValueError
    saying why when it cannot be.

    A label that stays non-ASCII after the mapping is checked by the ``idna``
    package (IDNA 2008), a little stricter than Go's UTS 46 profile (symbols, labels
    over 63 octets); every name that maps to ASCII is judged alike."""
    name = unicodedata.normalize("NFC", _go_lower(name))
    try:
        mapped = idna.uts46_remap(name, std3_rules=True)
    except (idna.IDNAError, UnicodeError) as exc:
        raise ValueError(str(exc)) from exc
    labels = mapped.split(".")
    # x/net/idna's label iterator leaves the last label out when it is empty.
    checked = len(labels) - 1 if len(labels) > 1 and labels[-1] == "" else len(labels)
    ascii_name = ".".join(
        _a_label(label) if label and position < checked else label
        for position, label in enumerate(labels)
    )
    ascii_name = ascii_name.removesuffix(".")
    if len(ascii_name) > 253:
        raise ValueError(f"{ascii_name!r} exceeds 253 octets ({len(ascii_name)})")
    return ascii_name


def _ours(issuer_domains: Sequence[str]) -> set[str]:
    """Our issuer domain names in normalized form (Boulder's VA refuses to start with
    one that is not: ``va.NewValidationAuthorityImpl``)."""
    ours = set()
    for domain in issuer_domains:
        try:
            ours.add(normalize_issuer_domain_name(domain))
        except ValueError:
            ours.add(domain.lower().rstrip("."))
    return ours


# -- one record ---------------------------------------------------------------------


@dataclass(frozen=True)
class PersistParams:
    """A record's parameters as Boulder keeps them (``dnsPersistIssueValueParams``)."""

    account_uri: str
    policy: str = ""
    persist_until: int | None = None
    """UNIX seconds; None when absent."""


class MalformedRecord(CertflowError, ValueError):
    """A record ``parseDNSPersistRecord`` refuses; ``issuer`` is its normalized issuer
    domain name when it got that far (else empty), which decides whether the CA
    reports it or skips it silently."""

    def __init__(self, issuer: str, reason: str) -> None:
        super().__init__(reason)
        self.issuer = issuer
        self.reason = reason


def parse_record(record: str) -> tuple[str, PersistParams]:
    """(normalized issuer domain name, parameters) of one TXT record, or
    MalformedRecord, exactly as Boulder's ``parseDNSPersistRecord``."""
    parts = record.split(";")
    raw_issuer = parts[0].strip(_WSP)
    if not raw_issuer:
        raise MalformedRecord("", "has no issuer-domain-name")
    try:
        issuer = normalize_issuer_domain_name(raw_issuer)
    except ValueError as exc:
        raise MalformedRecord("", f"its issuer-domain-name is malformed ({exc})") from None
    account_uri, policy, persist_until = "", "", None
    seen: set[str] = set()
    for part in parts[1:]:
        param = part.strip(_WSP)
        if not param:
            raise MalformedRecord(issuer, "has an empty parameter or a trailing semicolon")
        if "=" not in param:
            raise MalformedRecord(issuer, f"parameter {param!r} is no tag=value pair")
        raw_tag, _, raw_value = param.partition("=")
        tag, value = raw_tag.strip(_WSP), raw_value.strip(_WSP)
        if not tag:
            raise MalformedRecord(issuer, f"parameter {param!r} has an empty tag")
        if any(not ("\x21" <= char <= "\x3a" or "\x3c" <= char <= "\x7e") for char in value):
            raise MalformedRecord(
                issuer, f"the value {value!r} of {tag!r} holds a space, a control or a non-ASCII character"
            )
        canonical = _go_lower(tag)
        if canonical not in ("accounturi", "policy", "persistuntil"):
            continue  # draft-01: "the server MUST ignore ... an unrecognized tag"
        if canonical in seen:
            raise MalformedRecord(issuer, f"repeats a parameter ({tag})")
        seen.add(canonical)
        if canonical == "accounturi":
            if not value:
                raise MalformedRecord(issuer, "has an empty accounturi")
            account_uri = value
        elif canonical == "policy":
            policy = value
        else:
            if not _PARSE_INT.fullmatch(value) or not _INT64[0] <= int(value) <= _INT64[1]:
                raise MalformedRecord(issuer, f"persistUntil {value!r} is not a UNIX time")
            persist_until = None if int(value) == _GO_ZERO_TIME else int(value)
    if not account_uri:
        raise MalformedRecord(issuer, "has no accounturi")
    return issuer, PersistParams(account_uri, policy, persist_until)


def _utc(seconds: int) -> str:
    try:
        return f"{datetime.fromtimestamp(seconds, timezone.utc):%Y-%m-%d %H:%M} UTC"
    except (OverflowError, OSError, ValueError):
        return f"UNIX time {seconds}"


def check_record(params: PersistParams, account_uri: str, wildcard: bool, now: datetime) -> str | None:
    """Why a well-formed record of ours does not authorize this account (None: it
    does), in Boulder's order (``checkDNSPersistRecord``): ``accounturi`` compared
    as strings, nothing folded; for a wildcard ``policy`` must be ``wildcard`` in
    any case (for another name it is ignored); the validation must not be after
    ``persistUntil``."""
    if params.account_uri != account_uri:
        return f"names another account (ours is {account_uri})"
    if wildcard and params.policy.lower() != "wildcard":
        return "lacks policy=wildcard, which a wildcard needs"
    if params.persist_until is not None and now.timestamp() > params.persist_until:
        return f"expired at {_utc(params.persist_until)} (persistUntil)"
    return None


# -- the record set -----------------------------------------------------------------


def judge(
    records: Sequence[str],
    hostname: str,
    issuer_domains: Sequence[str],
    account_uri: str | None,
    now: datetime | None = None,
) -> str | None:
    """Why no record authorizes this CA and account for ``hostname`` (None: one does),
    as Boulder's ``validateDNSPersist01`` decides: records for other issuer domains
    and malformed ones are skipped, the first valid record of ours wins. Failing,
    the reason is the malformed records that name our issuer (Boulder's
    ``malformed`` problem), else those that do not authorize us (``unauthorized``);
    else no record is ours, and the records skipped for a malformed issuer are
    named."""
    now = now or datetime.now(timezone.utc)
    ours = _ours(issuer_domains)
    wanted = " or ".join(sorted(ours))
    if not records:
        return f"no TXT record at all, so no record for {wanted}"
    malformed: list[str] = []
    unauthorized: list[str] = []
    skipped: list[str] = []
    for text in records:
        try:
            issuer, params = parse_record(text)
        except MalformedRecord as bad:
            if bad.issuer in ours:
                malformed.append(f"{text!r} {bad.reason}")
            elif not bad.issuer:
                skipped.append(f"{text!r}: {bad.reason}")
            continue
        if issuer not in ours:
            continue
        if account_uri is None:
            unauthorized.append("our ACME account URL at this CA is not known yet")
            continue
        why = check_record(params, account_uri, hostname.startswith("*."), now)
        if why is not None:
            unauthorized.append(f"{text!r} {why}")
            continue
        return None
    if malformed or unauthorized:
        return "; ".join(malformed or unauthorized)
    reason = f"no record for {wanted}"
    if skipped:
        reason += " (skipped, as the CA skips them: " + "; ".join(skipped) + ")"
    return reason


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


# -- the challenge ------------------------------------------------------------------


def check_challenge(
    challenge: Mapping[str, object],
    hostname: str,
    issuer_domains: Sequence[str],
    account_uri: str | None,
) -> None:
    """Before a dns-persist-01 challenge is accepted: DnsCheckError(DNS_PERSIST),
    naming both values and the record to publish, when the challenge (its JSON)
    says the CA expects an ``accounturi`` other than ``account_uri`` (our account
    URL, which the record was judged against), or lists ``issuer-domain-names``
    none of which is ours. Either way the CA would refuse the record: no
    validation is spent on it.

    Boulder puts in the challenge the very values its VA compares
    (``wfe2/wfe.go`` prepChallengeForDisplay: ``accounturi`` AccountURIPrefix +
    registration ID, ``issuer-domain-names`` its CAA identity; ``va/va.go``
    PerformValidation: AccountURIPrefixes[0] + registration ID), and draft-02
    changes the ``accounturi`` form: the challenge's value is the one that counts."""
    name = persist_name(hostname)
    listed = challenge.get("issuer-domain-names")
    theirs = [str(d) for d in listed] if isinstance(listed, list) else []
    ours = _ours(issuer_domains)
    named = [d for d in theirs if _ours([d]) & ours]
    issuer = named[0] if named else (theirs[0] if theirs else (issuer_domains[0] if issuer_domains else ""))
    expected = challenge.get("accounturi")
    uri = expected if isinstance(expected, str) and expected else account_uri
    record = persist_record(hostname, issuer, uri).value if issuer and uri else ""
    publish = f"; publish {name} TXT \"{record}\"" if record else ""
    if isinstance(expected, str) and expected and expected != account_uri:
        raise DnsCheckError(
            ErrorCode.DNS_PERSIST,
            f"the CA's dns-persist-01 challenge for {hostname} expects accounturi={expected}, but"
            f" {name} was checked against our account URL {account_uri}: the CA would refuse it,"
            f" so nothing was accepted{publish}",
            expected=record,
        )
    if theirs and not named:
        raise DnsCheckError(
            ErrorCode.DNS_PERSIST,
            f"the CA's dns-persist-01 challenge for {hostname} accepts issuer domain names"
            f" {', '.join(theirs)}, but {name} was checked for {' or '.join(sorted(ours))}: the CA"
            f" would refuse it, so nothing was accepted{publish}",
            expected=record,
        )
