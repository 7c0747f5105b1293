"""CAA records as a resolver answers them and as Boulder parses them (``va/caa.go``).

What one answer to a CAA query holds — the CNAME chain the resolver followed and
the CAA records (:func:`parse_caa_response`) — and what an ``issue`` or
``issuewild`` value says: its issuer domain and parameters (RFC 8659 §4.2,
:func:`parse_issue_value`). Plain data, no lookups; which set decides is
``caa_climb``'s business, what it allows ``caa_verdict``'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import dns.message
import dns.rdatatype
import dns.rdtypes.ANY.CAA

from certflow.dns.lookup import CnameAnswer, cname_answers, rrsets

# RFC 8659 §4.2 issue-value grammar pieces.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
ISSUER_DOMAIN_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
# Parameter tags as Boulder's parseCAARecord accepts them: ASCII letters and
# digits only (no hyphens, although RFC 8659's grammar allows inner ones).
_PARAM_TAG_RE = re.compile(r"[A-Za-z0-9]*")
_PARAM_VALUE_RE = re.compile(r"[\x21-\x3a\x3c-\x7e]*")
_WSP = " \t"


@dataclass(frozen=True)
class CaaRecord:
    """One CAA resource record's data (RFC 8659 §4.1)."""

    flags: int
    tag: str
    value: str

    @property
    def critical(self) -> bool:
        """The Issuer Critical flag: bit 128, or bit 1 as many tools write it (as Boulder)."""
        return bool(self.flags & (128 | 1))

    def to_text(self) -> str:
        """Zone-file presentation, e.g. ``0 issue "letsencrypt.org"``."""
        return f'{self.flags} {self.tag} "{escape_character_string(self.value)}"'


@dataclass(frozen=True)
class CaaAnswer:
    """A CAA record as returned by a lookup, with the name that owns it."""

    owner: str
    record: CaaRecord


@dataclass(frozen=True)
class CaaAnswerSet:
    """The answer section of a CAA query: the CNAME chain the resolver followed
    (owner → target …) and the CAA records (normally owned by the chain's last
    name). Both may be empty (NXDOMAIN, NODATA, or NODATA at the alias target)."""

    cnames: Sequence[CnameAnswer] = ()
    caa: Sequence[CaaAnswer] = ()


def escape_character_string(value: str) -> str:
    out = []
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable() and char.isascii():
            out.append(char)
        else:
            out.extend(f"\\{byte:03d}" for byte in char.encode("utf-8", "surrogatepass"))
    return "".join(out)


@dataclass(frozen=True)
class IssueValue:
    """A parsed ``issue``/``issuewild`` value: issuer-domain as written (``""``
    for ``";"``) and its parameters in order, tags as written."""

    issuer: str
    params: tuple[tuple[str, str], ...]


def parse_issue_value(value: str) -> IssueValue | None:
    """Parse an ``issue``/``issuewild`` value (RFC 8659 §4.2), ``None`` if malformed.

    Mirrors Boulder's ``parseCAARecord``: split on ``;``, whitespace (space,
    tab) trimmed; one empty parameter after the domain is allowed
    (``letsencrypt.org;``), any other parameter must be ``tag=value`` with an
    alphanumeric tag and a value of printable ASCII without ``;``. A malformed
    parameter makes the whole value malformed (it authorizes nothing). Unlike
    Boulder, the issuer-domain is checked against the RFC 8659 grammar too,
    which changes no verdict (a malformed domain never equals the CA's), only
    the message.
    """
    issuer, *params = value.split(";")
    issuer = issuer.strip(_WSP)
    if issuer and not ISSUER_DOMAIN_RE.fullmatch(issuer):
        return None
    if len(params) == 1 and not params[0].strip(_WSP):
        params = []
    parsed: list[tuple[str, str]] = []
    for param in params:
        tag, equals, param_value = param.partition("=")
        tag, param_value = tag.strip(_WSP), param_value.strip(_WSP)
        if (
            not equals
            or not _PARAM_TAG_RE.fullmatch(tag)
            or not _PARAM_VALUE_RE.fullmatch(param_value)
        ):
            return None
        parsed.append((tag, param_value))
    # Kept as written: Boulder compares issuer domains byte for byte
    # (va/caa.go caaDomainMatches: caaDomain == issuerDomain).
    return IssueValue(issuer, tuple(parsed))


def parse_caa_response(response: dns.message.Message) -> CaaAnswerSet:
    """The CNAME and CAA records (class IN, any owner) in a CAA response's answer section.

    A resolver answering a CAA query for an alias puts the CNAME chain first,
    then the CAA RRset of its last name (none: NODATA at the target); a DNAME
    comes with the CNAME it synthesizes, which is what the chain follows.
    Which records count is ``caa_climb.find_caa_set``'s business.
    """
    answers: list[CaaAnswer] = []
    for rrset in rrsets(response, dns.rdatatype.CAA):
        owner = rrset.name.to_text(omit_final_dot=True)
        for rdata in rrset:
            if not isinstance(rdata, dns.rdtypes.ANY.CAA.CAA):
                continue
            record = CaaRecord(
                flags=rdata.flags,
                # Tags are ASCII by spec; values are arbitrary octets.
                # backslashreplace keeps odd bytes visible (and malformed).
                tag=rdata.tag.decode("ascii", "backslashreplace"),
                value=rdata.value.decode("utf-8", "backslashreplace"),
            )
            answers.append(CaaAnswer(owner, record))
    return CaaAnswerSet(cnames=cname_answers(response), caa=answers)
