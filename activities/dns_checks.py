"""DNS pre-checks before an ACME order (SPEC §3.1): the CNAME chain and CAA.

The decisions are pure functions over plain data (:func:`caa_decision`) or over
an injected lookup callable (:func:`follow_cname_chain`, :func:`check_caa`), so
they are unit-testable without DNS. :class:`DnsChecker` binds them to real
queries against the configured resolver with dnspython.

Failures are :class:`~certflow.errors.DnsCheckError` with code ``DNS_CNAME``,
``DNS_CAA`` or, for a failed CAA lookup, ``ACME_TEMPORARY`` (SPEC §4).
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import dns.asyncquery
import dns.exception
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.CAA
import dns.rdtypes.ANY.CNAME
import dns.rrset

from temporalio import activity

from certflow.errors import ConfigError, DnsCheckError, ErrorCode, to_application_error
from certflow.hostnames import InvalidHostnameError, normalize_hostname
from certflow.metrics import CertflowMetrics
from certflow.tracing import step_span
from certflow.models import CheckDnsInput

__all__ = [
    "CNAME_MAX_LOOKUPS",
    "DNS_TIMEOUT_SECONDS",
    "CaaAnswer",
    "CaaLookup",
    "CaaRecord",
    "CaaVerdict",
    "CnameAnswer",
    "CnameLookup",
    "DnsActivities",
    "DnsChecker",
    "DnsLookupError",
    "caa_decision",
    "caa_lookup_names",
    "check_caa",
    "follow_cname_chain",
    "parse_resolver_address",
]

CNAME_MAX_LOOKUPS = 4
DNS_TIMEOUT_SECONDS = 10.0

# Big enough for real CAA RRsets, small enough to avoid IP fragmentation
# (DNS Flag Day 2020); larger answers come back truncated and go over TCP.
_EDNS_PAYLOAD = 1232

# Property tags a CA is expected to understand. Anything else is "unknown", and
# an unknown tag marked critical forbids issuance (RFC 8659 §4.1). Beyond
# RFC 8659's three: issuemail (RFC 9495), issuevmc (BIMI), contactemail and
# contactphone (CA/B Forum BR) are registered and do not concern TLS issuance.
_KNOWN_CAA_TAGS = frozenset(
    {"issue", "issuewild", "iodef", "issuemail", "issuevmc", "contactemail", "contactphone"}
)

# RFC 8659 §4.2 issue-value grammar pieces.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_ISSUER_DOMAIN_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PARAM_TAG_RE = re.compile(_LABEL)
_PARAM_VALUE_RE = re.compile(r"[\x21-\x3a\x3c-\x7e]*")
_WSP = " \t"

_PREVIEW_CHARS = 60


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class CaaRecord:
    """One CAA resource record's data (RFC 8659 §4.1)."""

    flags: int
    tag: str
    value: str

    @property
    def critical(self) -> bool:
        """The Issuer Critical flag: bit 0 (value 128), or value 1 as some tools write it."""
        return bool(self.flags & 128) or self.flags == 1

    def to_text(self) -> str:
        """Zone-file presentation, e.g. ``0 issue "letsencrypt.org"``."""
        return f'{self.flags} {self.tag} "{_escape_character_string(self.value)}"'


@dataclass(frozen=True)
class CaaAnswer:
    """A CAA record as returned by a lookup, with the name that owns it."""

    owner: str
    record: CaaRecord


@dataclass(frozen=True)
class CnameAnswer:
    """A CNAME record as returned by a lookup: ``owner`` is an alias for ``target``."""

    owner: str
    target: str


@dataclass(frozen=True)
class CaaVerdict:
    """Whether a CAA RRset lets the configured issuer issue, and why (for humans)."""

    allowed: bool
    reason: str


class DnsLookupError(Exception):
    """A lookup got no usable answer: timeout, SERVFAIL/REFUSED, network error.

    NXDOMAIN and an empty NOERROR answer are *not* errors (they are an empty
    result). The check functions turn this into the right :class:`DnsCheckError`.
    """

    def __init__(self, name: str, rdtype: str, reason: str) -> None:
        self.name = name
        self.rdtype = rdtype
        self.reason = reason
        super().__init__(f"{rdtype} lookup for {name} failed: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.name, self.rdtype, self.reason))


CnameLookup = Callable[[str], Awaitable[Sequence[CnameAnswer]]]
"""Returns the CNAME records in the answer to a CNAME query for a name."""

CaaLookup = Callable[[str], Awaitable[Sequence[CaaAnswer]]]
"""Returns the CAA records in the answer to a CAA query for a name."""


# --------------------------------------------------------------------------- helpers


def _canonical(name: str) -> str:
    """DNS names compare case-insensitively; a trailing dot only marks them absolute."""
    name = name.strip().lower()
    return name[:-1] if name.endswith(".") else name


def _quote(text: str) -> str:
    """Untrusted DNS data, rendered short and escaped for messages."""
    if len(text) <= _PREVIEW_CHARS:
        return repr(text)
    return f"{text[:_PREVIEW_CHARS]!r}..."


def _escape_character_string(value: str) -> str:
    out = []
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable() and char.isascii():
            out.append(char)
        else:
            out.extend(f"\\{byte:03d}" for byte in char.encode("utf-8", "surrogatepass"))
    return "".join(out)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _parse_issue_value(value: str) -> str | None:
    """The issuer-domain of an ``issue``/``issuewild`` value, lower case.

    Returns ``""`` when the value names no issuer (``";"``, empty), which
    authorizes nobody, and ``None`` when the value is malformed. Parameters are
    checked for syntax only (a malformed parameter makes the whole value
    malformed, as in Let's Encrypt's Boulder); their meaning is not evaluated.
    """
    issuer, _, params = value.partition(";")
    issuer = issuer.strip(_WSP)
    if issuer and not _ISSUER_DOMAIN_RE.fullmatch(issuer):
        return None
    if params.strip(_WSP):
        for param in params.split(";"):
            tag, equals, param_value = param.partition("=")
            if (
                not equals
                or not _PARAM_TAG_RE.fullmatch(tag.strip(_WSP))
                or not _PARAM_VALUE_RE.fullmatch(param_value.strip(_WSP))
            ):
                return None
    return issuer.lower()


# --------------------------------------------------------------------------- pure decisions


def caa_decision(
    records: Sequence[CaaRecord],
    issuer_domain: str,
    *,
    owner: str = "",
    wildcard: bool = False,
) -> CaaVerdict:
    """Decide whether a non-empty CAA RRset authorizes ``issuer_domain`` (RFC 8659).

    ``owner`` is the name the RRset belongs to; it only appears in the reason.
    ``wildcard`` selects ``issuewild`` semantics (it takes precedence over
    ``issue`` when present); for ordinary names ``issuewild`` is ignored.
    """
    where = f"CAA at {_canonical(owner)}" if owner else "CAA"
    issuer = _canonical(issuer_domain)

    for record in records:
        if record.tag.lower() not in _KNOWN_CAA_TAGS and record.critical:
            return CaaVerdict(
                False,
                f"{where} has an unknown critical property {_quote(record.tag)} "
                f"(flags {record.flags}), which forbids issuance",
            )

    tag = "issue"
    relevant = [r for r in records if r.tag.lower() == "issue"]
    if wildcard:
        wild = [r for r in records if r.tag.lower() == "issuewild"]
        if wild:
            tag, relevant = "issuewild", wild
    if not relevant:
        return CaaVerdict(True, f"{where} has no {tag} records, so any CA may issue")

    named: list[str] = []
    malformed: list[str] = []
    empty: list[str] = []
    for record in relevant:
        parsed = _parse_issue_value(record.value)
        if parsed is None:
            malformed.append(record.value)
        elif parsed == issuer:
            return CaaVerdict(True, f"{where} allows {issuer}")
        elif parsed:
            named.append(parsed)
        else:
            # An explicit "no CA" (";"): authorizes nobody.
            empty.append(record.value)

    if named:
        reason = f"{where} allows only {', '.join(_unique(named))}"
    elif empty:
        shown = _escape_character_string(empty[0])
        reason = f'{where} forbids all certificate issuance ({tag} "{shown}")'
    else:
        reason = f"{where} has only malformed {tag} values, which authorize no CA"
    if malformed:
        reason += f" (malformed: {', '.join(_quote(v) for v in _unique(malformed))})"
    return CaaVerdict(False, reason)


def caa_lookup_names(hostname: str) -> list[str]:
    """The names whose CAA RRsets are consulted: the name, then each parent up to the TLD."""
    labels = _canonical(hostname).split(".")
    return [".".join(labels[i:]) for i in range(len(labels)) if labels[i]]


async def check_caa(hostname: str, issuer_domain: str, lookup: CaaLookup) -> None:
    """Raise unless CAA lets ``issuer_domain`` issue for ``hostname``.

    The first name (hostname, then parents up to the TLD) with CAA records
    owned by that exact name decides; records the resolver returned for a
    CNAME target are ignored. No records anywhere → permitted.

    Raises ``DnsCheckError(DNS_CAA)`` when denied and
    ``DnsCheckError(ACME_TEMPORARY)`` when a lookup fails (SERVFAIL, timeout),
    because a failed lookup is not a denial.
    """
    host = _canonical(hostname)
    issuer = _canonical(issuer_domain)
    for name in caa_lookup_names(host):
        try:
            answers = await lookup(name)
        except DnsLookupError as exc:
            raise DnsCheckError(
                ErrorCode.ACME_TEMPORARY,
                f"CAA lookup for {name} failed: {exc.reason}",
                found=[],
                expected=issuer,
            ) from exc
        records = [a.record for a in answers if _canonical(a.owner) == name]
        if not records:
            continue
        verdict = caa_decision(records, issuer, owner=name)
        if verdict.allowed:
            return
        message = verdict.reason if name == host else f"{verdict.reason} (applies to {host})"
        raise DnsCheckError(
            ErrorCode.DNS_CAA,
            message,
            found=[r.to_text() for r in records],
            expected=issuer,
        )


async def follow_cname_chain(hostname: str, target: str, lookup: CnameLookup) -> None:
    """Raise ``DnsCheckError(DNS_CNAME)`` unless ``hostname`` aliases ``target``.

    Follows the chain one CNAME lookup at a time, at most
    :data:`CNAME_MAX_LOOKUPS` lookups. Fails on: no CNAME at the hostname, a
    chain ending at another name, a loop, a chain that is too long, several
    CNAMEs for one owner, an answer owned by a name other than the one asked,
    and lookup errors. ``found`` lists the aliases seen (or the offending
    records); ``expected`` is the target.
    """
    start = _canonical(hostname)
    expected = _canonical(target)
    chain: list[str] = []
    seen = {start}
    current = start

    def fail(message: str, found: list[str] | None = None) -> DnsCheckError:
        return DnsCheckError(
            ErrorCode.DNS_CNAME,
            message,
            found=list(chain) if found is None else found,
            expected=expected,
        )

    for _ in range(CNAME_MAX_LOOKUPS):
        try:
            answers = await lookup(current)
        except DnsLookupError as exc:
            raise fail(f"could not look up the CNAME record of {current}: {exc.reason}") from exc

        if not answers:
            if not chain:
                raise fail(f"{start} has no CNAME record; expected a CNAME to {expected}")
            raise fail(f"{start} is a CNAME to {' -> '.join(chain)}; expected {expected}")

        foreign = [a for a in answers if _canonical(a.owner) != current]
        if foreign:
            raise fail(
                f"the CNAME answer for {current} is owned by {_canonical(foreign[0].owner)}; "
                f"expected a record owned by {current}",
                found=[f"{_canonical(a.owner)} CNAME {_canonical(a.target)}" for a in answers],
            )

        targets = _unique(_canonical(a.target) for a in answers)
        if len(targets) > 1:
            raise fail(
                f"{current} has {len(targets)} CNAME records ({', '.join(targets)}); "
                f"expected exactly one, to {expected}",
                found=targets,
            )

        current = targets[0]
        chain.append(current)
        if current == expected:
            return
        if current in seen:
            raise fail(f"{start} has a CNAME loop: {' -> '.join([start, *chain])}")
        seen.add(current)

    raise fail(
        f"{start} has a CNAME chain longer than {CNAME_MAX_LOOKUPS} lookups "
        f"({' -> '.join([start, *chain])} -> ...) that does not reach {expected}"
    )


# --------------------------------------------------------------------------- real lookups


def parse_resolver_address(spec: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port``, bare host or bare IPv6 → port 53).

    Raises :class:`~certflow.errors.ConfigError` when malformed.
    """
    text = spec.strip()
    port_text = "53"
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"DNS resolver {spec!r}: expected host:port or [ipv6]:port")
        if rest:
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host = text  # a hostname, IPv4 or bare IPv6 address
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"DNS resolver {spec!r}: expected host:port with a port in 1-65535")
    return host, int(port_text)


async def _server_ip(host: str, port: int) -> str:
    """dnspython wants an IP; a host name (e.g. a compose service) is resolved here."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        if not infos:
            raise OSError(f"cannot resolve {host}") from None
        return str(infos[0][4][0])
    return host


async def _query(
    name: str, rdtype: dns.rdatatype.RdataType, server: tuple[str, int], timeout: float
) -> dns.message.Message:
    """One recursive query to the configured resolver; UDP, TCP when truncated."""
    host, port = server
    type_text = dns.rdatatype.to_text(rdtype)
    display = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        # One deadline for the whole exchange: udp_with_fallback's own timeout
        # applies to UDP and TCP separately.
        async with asyncio.timeout(timeout):
            where = await _server_ip(host, port)
            query = dns.message.make_query(name, rdtype, use_edns=0, payload=_EDNS_PAYLOAD)
            response, _ = await dns.asyncquery.udp_with_fallback(
                query, where, timeout=timeout, port=port, ignore_unexpected=True
            )
    except (TimeoutError, dns.exception.Timeout):
        raise DnsLookupError(
            name, type_text, f"no answer from resolver {display} within {timeout:g} s"
        ) from None
    except (OSError, dns.exception.DNSException) as exc:
        raise DnsLookupError(name, type_text, f"resolver {display}: {exc}") from exc
    rcode = response.rcode()
    if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        raise DnsLookupError(
            name, type_text, f"resolver {display} answered {dns.rcode.to_text(rcode)}"
        )
    return response


def _rrsets(
    response: dns.message.Message, rdtype: dns.rdatatype.RdataType
) -> Iterable[dns.rrset.RRset]:
    return (
        rrset
        for rrset in response.answer
        if rrset.rdtype == rdtype and rrset.rdclass == dns.rdataclass.IN
    )


@dataclass(frozen=True)
class DnsChecker:
    """SPEC §3.1 DNS checks against one resolver.

    ``resolver`` is ``host:port``; ``cname_target`` the edge name customers
    must alias; ``caa_issuer_domain`` the CA's CAA issuer-domain (e.g.
    ``letsencrypt.org``). Invalid settings raise ``ConfigError`` at construction.
    """

    resolver: str
    cname_target: str
    caa_issuer_domain: str
    timeout: float = DNS_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        parse_resolver_address(self.resolver)
        try:
            target = normalize_hostname(self.cname_target)
        except InvalidHostnameError as exc:
            raise ConfigError(f"CNAME target: {exc}") from None
        # Frozen: normalize in place once, so messages show the canonical name.
        object.__setattr__(self, "cname_target", target)
        issuer = _canonical(self.caa_issuer_domain)
        if not _ISSUER_DOMAIN_RE.fullmatch(issuer):
            raise ConfigError(
                f"CAA issuer domain {self.caa_issuer_domain!r} is not a valid "
                "RFC 8659 issuer-domain-name"
            )
        object.__setattr__(self, "caa_issuer_domain", issuer)
        if self.timeout <= 0:
            raise ConfigError(f"DNS timeout must be positive, got {self.timeout!r}")

    async def check(self, hostname: str) -> None:
        """Run the CNAME check, then the CAA check, for ``hostname``.

        Raises ``DnsCheckError`` (DNS_CNAME, DNS_CAA or ACME_TEMPORARY), or
        ``InvalidHostnameError`` when ``hostname`` is not a valid name at all.
        """
        host = normalize_hostname(hostname)
        await follow_cname_chain(host, self.cname_target, self.lookup_cname)
        await check_caa(host, self.caa_issuer_domain, self.lookup_caa)

    async def lookup_cname(self, name: str) -> list[CnameAnswer]:
        """The CNAME records in the resolver's answer for ``name`` (any owner)."""
        response = await _query(
            name, dns.rdatatype.CNAME, parse_resolver_address(self.resolver), self.timeout
        )
        answers: list[CnameAnswer] = []
        for rrset in _rrsets(response, dns.rdatatype.CNAME):
            owner = rrset.name.to_text(omit_final_dot=True)
            for rdata in rrset:
                if not isinstance(rdata, dns.rdtypes.ANY.CNAME.CNAME):
                    continue
                answers.append(CnameAnswer(owner, rdata.target.to_text(omit_final_dot=True)))
        return answers

    async def lookup_caa(self, name: str) -> list[CaaAnswer]:
        """The CAA records in the resolver's answer for ``name`` (any owner)."""
        response = await _query(
            name, dns.rdatatype.CAA, parse_resolver_address(self.resolver), self.timeout
        )
        answers: list[CaaAnswer] = []
        for rrset in _rrsets(response, dns.rdatatype.CAA):
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
        return answers


class DnsActivities:
    """The ``check_dns`` activity around a :class:`DnsChecker`."""

    def __init__(self, checker: DnsChecker, metrics: CertflowMetrics | None = None) -> None:
        self._checker = checker
        self._metrics = metrics or CertflowMetrics()

    @activity.defn(name="check_dns")
    async def check_dns(self, input: CheckDnsInput) -> None:
        """CNAME then CAA; a typed DNS_CNAME / DNS_CAA / ACME_TEMPORARY error otherwise."""
        started = time.monotonic()
        try:
            with step_span("dns_check", **{"certificate.hostname": input.hostname}):
                await self._checker.check(input.hostname)
        except DnsCheckError as err:
            dns = err.code in (ErrorCode.DNS_CNAME, ErrorCode.DNS_CAA)
            self._metrics.step("dns_check", "dns_error" if dns else "error", started)
            raise to_application_error(err) from None
        self._metrics.step("dns_check", "ok", started)
