"""DNS lookups through the resolver, as Let's Encrypt's resolver client makes them:
one recursive query (UDP, TCP when truncated) under one deadline, failures in
Boulder's words (``bdns.Error``), NXDOMAIN and empty answers an empty result."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import dns.asyncquery
import dns.exception
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.CNAME
import dns.rrset

from certflow.errors import CertflowError, ConfigError

DNS_TIMEOUT_SECONDS = 10.0


# Big enough for real CAA RRsets, small enough to avoid IP fragmentation
# (DNS Flag Day 2020); larger answers come back truncated and go over TCP.
_EDNS_PAYLOAD = 1232

@dataclass(frozen=True)
class CnameAnswer:
    """A CNAME record as returned by a lookup: ``owner`` is an alias for ``target``."""

    owner: str
    target: str


class DnsLookupError(CertflowError):
    """A lookup got no usable answer: timeout, SERVFAIL/REFUSED, network error.

    NXDOMAIN and an empty NOERROR answer are *not* errors (they are an empty
    result). The check functions turn this into the right :class:`DnsCheckError`.
    """

    def __init__(self, name: str, rdtype: str, reason: str, ca_detail: str = "") -> None:
        self.name = name
        self.rdtype = rdtype
        self.reason = reason
        self.ca_detail = ca_detail or f"DNS problem: {_SERVER_FAILURE} looking up {rdtype} for {name}"
        """What Let's Encrypt's resolver client says of the same failure (Boulder's
        ``bdns.Error``), e.g. ``DNS problem: SERVFAIL looking up A for x - the
        domain's nameservers may be malfunctioning``."""
        super().__init__(f"{rdtype} lookup for {name} failed: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.name, self.rdtype, self.reason, self.ca_detail))


# Boulder's bdns/problem.go wording.
_SERVER_FAILURE = "server failure at resolver"
_RCODE_EXPLANATIONS = {
    dns.rcode.NXDOMAIN: "check that a DNS record exists for this domain",
    dns.rcode.SERVFAIL: "the domain's nameservers may be malfunctioning",
}


def _ca_detail(rdtype: str, name: str, *, rcode: dns.rcode.Rcode | None = None, timeout: bool = False) -> str:
    """Boulder's ``bdns.Error`` text for a failed lookup."""
    if timeout:
        detail, additional = "query timed out", ""
    elif rcode is not None:
        detail = dns.rcode.to_text(rcode)
        explanation = _RCODE_EXPLANATIONS.get(rcode)
        additional = f" - {explanation}" if explanation else ""
    else:
        detail, additional = "networking error", ""
    return f"DNS problem: {detail} looking up {rdtype} for {name}{additional}"


CnameLookup = Callable[[str], Awaitable[Sequence[CnameAnswer]]]
"""Returns the CNAME records in the answer to a CNAME query for a name."""


def canonical(name: str) -> str:
    """DNS names compare case-insensitively; a trailing dot only marks them absolute."""
    name = name.strip().lower()
    return name[:-1] if name.endswith(".") else name


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


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


async def query(
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
            name,
            type_text,
            f"no answer from resolver {display} within {timeout:g} s",
            _ca_detail(type_text, name, timeout=True),
        ) from None
    except (OSError, dns.exception.DNSException) as exc:
        raise DnsLookupError(
            name, type_text, f"resolver {display}: {exc}", _ca_detail(type_text, name)
        ) from exc
    rcode = response.rcode()
    if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        raise DnsLookupError(
            name,
            type_text,
            f"resolver {display} answered {dns.rcode.to_text(rcode)}",
            _ca_detail(type_text, name, rcode=rcode),
        )
    return response


def rrsets(
    response: dns.message.Message, rdtype: dns.rdatatype.RdataType
) -> Iterable[dns.rrset.RRset]:
    return (
        rrset
        for rrset in response.answer
        if rrset.rdtype == rdtype and rrset.rdclass == dns.rdataclass.IN
    )


def cname_answers(response: dns.message.Message) -> list[CnameAnswer]:
    answers: list[CnameAnswer] = []
    for rrset in rrsets(response, dns.rdatatype.CNAME):
        owner = rrset.name.to_text(omit_final_dot=True)
        for rdata in rrset:
            if isinstance(rdata, dns.rdtypes.ANY.CNAME.CNAME):
                answers.append(CnameAnswer(owner, rdata.target.to_text(omit_final_dot=True)))
    return answers


