"""Delegated dns-01: the challenge's TXT in a zone certflow controls.

The customer adds once ``_acme-challenge.<host> CNAME <label>.<zone>``, the label
derived from the hostname (one name, one label, for ever); a wildcard
``*.<host>`` shares its base name's. For each challenge certflow replaces the TXT at
``<label>.<zone>`` with an RFC 2136 UPDATE signed with TSIG (dnspython builds and
signs it), and accepts only once every authoritative server of the zone (its NS
set, asked directly) answers the new value; after the order it deletes it. The CA
follows the customer's CNAME to our zone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rdtypes.ANY.TXT
import dns.tsig
import dns.tsigkeyring
import dns.update

from certflow.dns.lookup import (
    CnameAnswer,
    DnsLookupError,
    canonical,
    parse_resolver_address,
)
from certflow.errors import DnsCheckError, ErrorCode, ProvisioningError
from certflow.models import DnsRecord

CHALLENGE_LABEL = "_acme-challenge"
TXT_TTL = 30
"""Short: a value replaced for the next challenge must not linger in caches."""
UPDATE_TIMEOUT_SECONDS = 10.0
_TSIG_ALGORITHMS = {
    "hmac-sha256": dns.tsig.HMAC_SHA256,
    "hmac-sha384": dns.tsig.HMAC_SHA384,
    "hmac-sha512": dns.tsig.HMAC_SHA512,
}


@dataclass(frozen=True)
class TsigKey:
    """A TSIG key: its name, algorithm and secret (``name:algorithm:base64``)."""

    name: str
    algorithm: str
    secret: bytes

    def __repr__(self) -> str:
        return f"TsigKey({self.name!r}, {self.algorithm!r}, <secret>)"

    @classmethod
    def parse(cls, text: str) -> TsigKey:
        """``name:algorithm:base64-secret``, as knotc and nsupdate write keys;
        ValueError (never quoting the secret) when it is not one."""
        parts = text.strip().split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError("expected name:algorithm:base64-secret")
        name, algorithm, secret = parts
        if algorithm.lower() not in _TSIG_ALGORITHMS:
            known = ", ".join(_TSIG_ALGORITHMS)
            raise ValueError(f"algorithm {algorithm!r} is not one of {known}")
        try:
            raw = base64.b64decode(secret, validate=True)
        except binascii.Error:
            raise ValueError("the secret is not base64") from None
        if len(raw) < 16:
            raise ValueError("the secret is shorter than 16 bytes")
        return cls(canonical(name), algorithm.lower(), raw)


@dataclass(frozen=True)
class Dns01Zone:
    """The zone the delegations point into, where certflow writes challenge TXTs."""

    zone: str
    primary: str
    """``host:port`` of the zone's primary, which accepts the signed updates."""
    key: TsigKey
    authoritative_port: int = 53
    """The port the zone's NS answer on (53; tests run them on loopback)."""
    timeout: float = UPDATE_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "zone", canonical(self.zone))
        parse_resolver_address(self.primary)

    def target(self, hostname: str) -> str:
        """Where ``_acme-challenge.<hostname>`` must point: ``<label>.<zone>``."""
        return f"{delegation_label(hostname)}.{self.zone}"

    def delegation(self, hostname: str) -> DnsRecord:
        """The record the customer adds, once."""
        return DnsRecord(
            name=f"{CHALLENGE_LABEL}.{base_name(hostname)}", type="CNAME", value=self.target(hostname)
        )


def base_name(hostname: str) -> str:
    """The name a hostname is validated as: a wildcard's base name (RFC 8555 §7.1.3)."""
    return hostname[2:] if hostname.startswith("*.") else hostname


def delegation_label(hostname: str) -> str:
    """A DNS label for the hostname, the same for ever: 120 bits of SHA-256 of its
    base name, base32 (24 letters and digits). A wildcard shares its base name's."""
    digest = hashlib.sha256(base_name(hostname).encode()).digest()[:15]
    return base64.b32encode(digest).decode().lower()


def txt_value(key_authorization: str) -> str:
    """The dns-01 TXT value: base64url of SHA-256 of the key authorization (RFC 8555 §8.4)."""
    digest = hashlib.sha256(key_authorization.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


async def check_delegation(
    hostname: str, zone: Dns01Zone, lookup_cname: Callable[[str], Awaitable[Sequence[CnameAnswer]]]
) -> str:
    """Raise ``DnsCheckError(DNS_DELEGATION)`` unless ``_acme-challenge.<host>`` is a
    CNAME to our label; what was found when it is."""
    record = zone.delegation(hostname)
    try:
        answers = await lookup_cname(record.name)
    except DnsLookupError as err:
        raise DnsCheckError(
            ErrorCode.DNS_DELEGATION,
            f"could not look up the CNAME record of {record.name}: {err.reason}",
            expected=record.value,
        ) from err
    targets = sorted({canonical(a.target) for a in answers if canonical(a.owner) == record.name})
    if targets == [record.value]:
        return f"{record.name} is delegated to {record.value}"
    if not targets:
        found = f"{record.name} has no CNAME record"
    else:
        found = f"{record.name} is a CNAME to {', '.join(targets)}"
    raise DnsCheckError(
        ErrorCode.DNS_DELEGATION,
        f"{found}; add {record.name} CNAME {record.value}",
        found=targets,
        expected=record.value,
    )


def _update(zone: Dns01Zone) -> dns.update.UpdateMessage:
    keyring = dns.tsigkeyring.from_text({zone.key.name: base64.b64encode(zone.key.secret).decode()})
    return dns.update.UpdateMessage(
        zone.zone + ".",
        keyring=keyring,
        keyname=dns.name.from_text(zone.key.name),
        keyalgorithm=_TSIG_ALGORITHMS[zone.key.algorithm],
    )


async def _send(zone: Dns01Zone, update: dns.update.UpdateMessage, what: str) -> None:
    host, port = parse_resolver_address(zone.primary)

    def refused(reason: str) -> ProvisioningError:
        return ProvisioningError(
            ErrorCode.DNS01_UPDATE, f"our DNS primary {zone.primary} refused to {what}: {reason}"
        )

    try:
        response = await dns.asyncquery.tcp(update, host, timeout=zone.timeout, port=port)
    except dns.tsig.PeerError as err:  # the server did not accept our signature
        raise refused(f"TSIG {type(err).__name__} (is CERTFLOW_DNS01_TSIG_KEY the zone's key?)") from None
    except (dns.exception.DNSException, OSError, asyncio.TimeoutError) as err:
        raise ProvisioningError(
            ErrorCode.ACME_TEMPORARY, f"our DNS primary {zone.primary} did not answer: {err!r}"
        ) from None
    rcode = response.rcode()
    if rcode != dns.rcode.NOERROR:
        raise refused(dns.rcode.to_text(rcode))


async def publish(zone: Dns01Zone, hostname: str, value: str) -> None:
    """Make ``value`` the only TXT at the hostname's label (a leftover one of an
    earlier attempt is replaced in the same update)."""
    update = _update(zone)
    owner = delegation_label(hostname)
    update.delete(owner, "TXT")
    update.add(owner, TXT_TTL, "TXT", f'"{value}"')
    await _send(zone, update, f"write the TXT of {zone.target(hostname)}")


PROBE_LABEL = "_certflow-probe"


async def probe(zone: Dns01Zone) -> None:
    """A signed update that changes nothing (the delete of a TXT never written), so a
    wrong key or a primary that refuses updates shows before any order is placed."""
    update = _update(zone)
    update.delete(PROBE_LABEL, "TXT")
    await _send(zone, update, "accept a signed update")


async def withdraw(zone: Dns01Zone, hostname: str) -> None:
    """Delete the TXT at the hostname's label (none there is no error)."""
    update = _update(zone)
    update.delete(delegation_label(hostname), "TXT")
    await _send(zone, update, f"delete the TXT of {zone.target(hostname)}")


AddressLookup = Callable[[str, str], Awaitable[list[str]]]
"""The addresses of one family (``A``/``AAAA``) of a name, through the resolver."""
NameServerLookup = Callable[[str], Awaitable[list[str]]]
"""The NS names of a zone, through the resolver."""


async def missing_on(
    zone: Dns01Zone,
    hostname: str,
    value: str,
    nameservers: NameServerLookup,
    addresses: AddressLookup,
) -> list[str]:
    """The authoritative servers of the zone (each address of each NS, asked directly,
    no recursion) that do not answer ``value`` at the hostname's label yet; empty
    when every one does."""
    names = await nameservers(zone.zone)
    if not names:
        return [f"the NS set of {zone.zone} (none found)"]
    servers: list[str] = []
    for name in names:
        found: list[str] = []
        for family in ("A", "AAAA"):
            try:
                found += await addresses(name, family)
            except DnsLookupError:
                continue
        servers += found or [name]
    fqdn = dns.name.from_text(zone.target(hostname))
    # Asked together: a server that does not answer costs one timeout, not one each.
    unique = list(dict.fromkeys(servers))
    answered = await asyncio.gather(
        *(_answers(server, zone.authoritative_port, fqdn, value, zone.timeout) for server in unique)
    )
    return [server for server, ok in zip(unique, answered) if not ok]


async def _answers(server: str, port: int, name: dns.name.Name, value: str, timeout: float) -> bool:
    query = dns.message.make_query(name, dns.rdatatype.TXT)
    query.flags &= ~dns.flags.RD
    try:
        response = await dns.asyncquery.udp_with_fallback(query, server, timeout=timeout, port=port)
    except (dns.exception.DNSException, OSError, ValueError):
        return False
    response_message = response[0]
    for rrset in response_message.answer:
        if rrset.rdtype != dns.rdatatype.TXT:
            continue
        for rdata in rrset:
            if isinstance(rdata, dns.rdtypes.ANY.TXT.TXT) and b"".join(rdata.strings).decode() == value:
                return True
    return False
