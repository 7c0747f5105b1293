"""Delegated dns-01: the challenge's TXT in a zone certflow controls.

The customer adds once ``_acme-challenge.<host> CNAME <label>.<zone>``, the label
derived from the hostname (one name, one label, for ever); a wildcard
``*.<host>`` shares its base name's. So ``x`` and ``*.x``, two rows and two
workflows often validated at the same time, write at one label: each adds its own
value as one more TXT RR with an RFC 2136 UPDATE signed with TSIG (dnspython builds
and signs it), never replacing the RRset, and accepts only once every
authoritative server of the zone (its NS set, asked directly) answers that value
among the others; after the order it deletes values one RR at a time, never the
RRset. The CA accepts any one of several TXT values at the name (Boulder's
va/dns.go compares each with the expected digest). The CA follows the customer's
CNAME to our zone.

Which values at a label are still needed is the system of record's answer, not
DNS's: a value is in use while it is the digest of the key authorization of an
open order of a row sharing the label (the hostname or its wildcard; a row clears
its order once it is valid or abandoned). Every other value there is a leftover of
a finished attempt (its withdraw gave up, its workflow was terminated, an activity
timed out but still ran, code older than this): the next publish or withdraw at the label deletes it, whichever row it
belonged to, and never a value in use. The TXT set is read from the primary
before the values in use are read from Postgres, so a value added in between (its
order persisted first) is not in the set read and is never taken for a leftover.

The CA reads the label through a recursive resolver, which may keep the RRset it
fetched for the other row's validation for up to :data:`TXT_TTL` (Let's Encrypt's
resolvers up to 60 s): a value added after that fetch is not seen until it
expires. :func:`publish` adds ours only to the RRset as it read it (an RFC 2136
prerequisite), so it knows whether the label held another value then, and the
activity waits the TTL out before accepting when it did (or when the other row
finished an attempt within the TTL).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.TXT
import dns.tsig
import dns.tsigkeyring
import dns.update

from certflow.dns.cname import follow_cname_chain
from certflow.dns.tsig import TSIG_ALGORITHMS, TsigKey
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
"""Short: a value withdrawn, or an RRset read before a value was added, must not
linger in caches. The CA reads through a recursive resolver (Let's Encrypt's cap
what they keep at 60 s), which may hold an RRset fetched before our value was
added for up to this long: see :func:`publish`'s ``shared``."""
UPDATE_TIMEOUT_SECONDS = 10.0
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


def sharing_names(hostname: str) -> tuple[str, str]:
    """The hostnames whose challenges share the hostname's label: its base name and
    that name's wildcard."""
    base = base_name(hostname)
    return base, f"*.{base}"


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
    if len(targets) == 1:
        # A chain to our label (the customer's DNS provider aliasing its own name)
        # is followed by the CA's recursive resolver, as by Boulder's VA.
        try:
            await follow_cname_chain(record.name, record.value, lookup_cname)
        except DnsCheckError:
            pass
        else:
            return f"{record.name} is delegated to {record.value} through {targets[0]}"
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
        keyalgorithm=TSIG_ALGORITHMS[zone.key.algorithm],
    )


_PREREQUISITE_FAILED = frozenset(
    {dns.rcode.NXRRSET, dns.rcode.YXRRSET, dns.rcode.NXDOMAIN, dns.rcode.YXDOMAIN}
)
"""RFC 2136 §3.2: a prerequisite did not hold; nothing was changed."""


async def _send(zone: Dns01Zone, update: dns.update.UpdateMessage, what: str) -> bool:
    """Send ``update`` to our primary: True once applied, False when one of its
    prerequisites did not hold (nothing changed); a typed error otherwise."""
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
    if rcode in _PREREQUISITE_FAILED and update.prerequisite:
        return False
    if rcode != dns.rcode.NOERROR:
        raise refused(dns.rcode.to_text(rcode))
    return True


InUse = Callable[[], Awaitable[Collection[str]]]
"""The TXT values still needed at a label: those of the open orders of the rows
sharing it (Postgres), read when called."""


def _txt(value: str) -> dns.rdata.Rdata:
    return dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.TXT, f'"{value}"')


def leftovers(present: Sequence[str], in_use: Collection[str], value: str | None = None) -> list[str]:
    """The values of ``present`` (the TXT set at a label) that no open order uses,
    ``value`` (the one being published) aside: each one to delete."""
    return [v for v in dict.fromkeys(present) if v not in in_use and v != value]


def publish_update(
    zone: Dns01Zone, hostname: str, value: str, present: Sequence[str] | None, stale: Sequence[str] = ()
) -> dns.update.UpdateMessage:
    """The UPDATE adding ``value`` as one TXT RR at the hostname's label (RFC 2136
    §2.5.1: added to the RRset, whatever else it holds; the same RR twice is one)
    and deleting each of ``stale``, one RR each (§2.5.4), never the RRset. With
    ``present`` (the values read at the label), only if the RRset is still exactly
    those (§2.4.2; §2.4.3 none when empty): what the label held when ours was added
    is then known for sure."""
    update = _update(zone)
    owner = delegation_label(hostname)
    if present is not None and present:
        update.present(owner, *(_txt(v) for v in dict.fromkeys(present)))
    elif present is not None:
        update.absent(owner, dns.rdatatype.TXT)
    for old in stale:
        update.delete(owner, _txt(old))
    update.add(owner, TXT_TTL, _txt(value))
    return update


def delete_update(zone: Dns01Zone, hostname: str, stale: Sequence[str]) -> dns.update.UpdateMessage:
    """The UPDATE deleting each of ``stale`` at the hostname's label, one RR each
    (RFC 2136 §2.5.4), never the RRset."""
    update = _update(zone)
    owner = delegation_label(hostname)
    for old in stale:
        update.delete(owner, _txt(old))
    return update


async def values_at_primary(zone: Dns01Zone, hostname: str) -> list[str]:
    """The TXT values at the hostname's label as our primary answers them now (over
    TCP, no recursion): where updates land, so never behind them."""
    host, port = parse_resolver_address(zone.primary)
    query = dns.message.make_query(dns.name.from_text(zone.target(hostname)), dns.rdatatype.TXT)
    query.flags &= ~dns.flags.RD
    try:
        response = await dns.asyncquery.tcp(query, host, timeout=zone.timeout, port=port)
    except (dns.exception.DNSException, OSError, asyncio.TimeoutError) as err:
        raise ProvisioningError(
            ErrorCode.ACME_TEMPORARY, f"our DNS primary {zone.primary} did not answer: {err!r}"
        ) from None
    rcode = response.rcode()
    if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        raise ProvisioningError(
            ErrorCode.DNS01_UPDATE,
            f"our DNS primary {zone.primary} refused to read the TXT of {zone.target(hostname)}:"
            f" {dns.rcode.to_text(rcode)}",
        )
    return _txt_values(response)


def _txt_values(response: dns.message.Message) -> list[str]:
    return [
        b"".join(rdata.strings).decode()
        for rrset in response.answer
        if rrset.rdtype == dns.rdatatype.TXT
        for rdata in rrset
        if isinstance(rdata, dns.rdtypes.ANY.TXT.TXT)
    ]


PUBLISH_TRIES = 4
"""Tries of the update that adds our value to the label as we read it (the other
row's update landing between the read and ours makes it fail, changing nothing)."""


async def publish(zone: Dns01Zone, hostname: str, value: str, in_use: InUse) -> bool:
    """Add ``value`` at the hostname's label, next to whatever other values are
    there (the other row's), and delete, in the same update, each leftover no open
    order uses (:func:`leftovers`). The update holds only if the label still holds
    what was read (else it is read again), so the return is exact: ``shared``,
    whether the label held another value when ours was added. The CA's resolver may
    then hold an RRset without ours (see :data:`TXT_TTL`). When the label changes
    under every try, ours is added whatever is there (leftovers stay) and the
    answer is True."""
    what = f"add a TXT at {zone.target(hostname)}"
    for _ in range(PUBLISH_TRIES):
        present = await values_at_primary(zone, hostname)
        stale = leftovers(present, await in_use(), value)  # read after ``present``: see the module
        if await _send(zone, publish_update(zone, hostname, value, present, stale), what):
            return any(v != value for v in present)
    await _send(zone, publish_update(zone, hostname, value, None), what)
    return True


PROBE_LABEL = "_certflow-probe"


async def probe(zone: Dns01Zone) -> None:
    """A signed update that changes nothing (the delete of a TXT never written), so a
    wrong key or a primary that refuses updates shows before any order is placed."""
    update = _update(zone)
    update.delete(PROBE_LABEL, "TXT")
    await _send(zone, update, "accept a signed update")


async def withdraw(zone: Dns01Zone, hostname: str, in_use: InUse) -> list[str]:
    """Delete the values at the hostname's label that no open order uses, one RR
    each: the finished order's (its row has cleared it), and any leftover; a value
    in use (the other row's, under validation) stays. Returns those deleted (none
    there is no error, and sends nothing)."""
    present = await values_at_primary(zone, hostname)
    stale = leftovers(present, await in_use())  # read after ``present``: see the module
    if stale:
        await _send(zone, delete_update(zone, hostname, stale), f"delete a TXT at {zone.target(hostname)}")
    return stale


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
    no recursion) that do not answer ``value`` among the TXT values at the
    hostname's label yet (the other row's may be there too); empty when every one
    does."""
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
    return value in _txt_values(response[0])  # ours among the others, not the only one
