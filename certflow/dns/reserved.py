"""The addresses Let's Encrypt never connects to.

Boulder's ``iana`` package embeds IANA's IPv4 and IPv6 Special-Purpose Address
Registries and refuses every address in any of their blocks (``IsReservedAddr``):
the validation authority drops such A/AAAA records (``va/dns.go`` ``getAddrs``)
and never follows a redirect to one (``va/http.go`` ``extractRequestTarget``).
The blocks below are those registries as Boulder ships them
(``iana/data/iana-ipv{4,6}-special-registry-1.csv``), most specific first, as
Boulder sorts them, so a refusal names the narrowest block.

Multicast (224.0.0.0/4, ff00::/8) is in neither registry, so — as at the CA —
it is not refused here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_REGISTRY: tuple[tuple[str, str, str], ...] = (
    # IPv4 (iana-ipv4-special-registry-1.csv)
    ("0.0.0.0/8", '"This network"', "[RFC791], Section 3.2"),
    ("0.0.0.0/32", '"This host on this network"', "[RFC1122], Section 3.2.1.3"),
    ("10.0.0.0/8", "Private-Use", "[RFC1918]"),
    ("100.64.0.0/10", "Shared Address Space", "[RFC6598]"),
    ("127.0.0.0/8", "Loopback", "[RFC1122], Section 3.2.1.3"),
    ("169.254.0.0/16", "Link Local", "[RFC3927]"),
    ("172.16.0.0/12", "Private-Use", "[RFC1918]"),
    ("192.0.0.0/24", "IETF Protocol Assignments", "[RFC6890], Section 2.1"),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix", "[RFC7335]"),
    ("192.0.0.8/32", "IPv4 dummy address", "[RFC7600]"),
    ("192.0.0.9/32", "Port Control Protocol Anycast", "[RFC7723]"),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "[RFC8155]"),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery", "[RFC8880][RFC7050], Section 2.2"),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery", "[RFC8880][RFC7050], Section 2.2"),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)", "[RFC5737]"),
    ("192.31.196.0/24", "AS112-v4", "[RFC7535]"),
    ("192.52.193.0/24", "AMT", "[RFC7450]"),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "[RFC7526]"),
    ("192.88.99.2/32", "6a44-relay anycast address", "[RFC6751]"),
    ("192.168.0.0/16", "Private-Use", "[RFC1918]"),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", "[RFC7534]"),
    ("198.18.0.0/15", "Benchmarking", "[RFC2544]"),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)", "[RFC5737]"),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)", "[RFC5737]"),
    ("240.0.0.0/4", "Reserved", "[RFC1112], Section 4"),
    ("255.255.255.255/32", "Limited Broadcast", "[RFC8190] [RFC919], Section 7"),
    # IPv6 (iana-ipv6-special-registry-1.csv)
    ("::1/128", "Loopback Address", "[RFC4291]"),
    ("::/128", "Unspecified Address", "[RFC4291]"),
    ("::ffff:0:0/96", "IPv4-mapped Address", "[RFC4291]"),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", "[RFC6052]"),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", "[RFC8215]"),
    ("100::/64", "Discard-Only Address Block", "[RFC6666]"),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix", "[RFC9780]"),
    ("2001::/23", "IETF Protocol Assignments", "[RFC2928]"),
    ("2001::/32", "TEREDO", "[RFC4380] [RFC8190]"),
    ("2001:1::1/128", "Port Control Protocol Anycast", "[RFC7723]"),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "[RFC8155]"),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "[RFC9665]"),
    ("2001:2::/48", "Benchmarking", "[RFC5180][RFC Errata 1752]"),
    ("2001:3::/32", "AMT", "[RFC7450]"),
    ("2001:4:112::/48", "AS112-v6", "[RFC7535]"),
    ("2001:10::/28", "Deprecated (previously ORCHID)", "[RFC4843]"),
    ("2001:20::/28", "ORCHIDv2", "[RFC7343]"),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "[RFC9374]"),
    ("2001:db8::/32", "Documentation", "[RFC3849]"),
    ("2002::/16", "6to4", "[RFC3056]"),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", "[RFC7534]"),
    ("3fff::/20", "Documentation", "[RFC9637]"),
    ("5f00::/16", "Segment Routing (SRv6) SIDs", "[RFC9602]"),
    ("fc00::/7", "Unique-Local", "[RFC4193] [RFC8190]"),
    ("fe80::/10", "Link-Local Unicast", "[RFC4291]"),
)


@dataclass(frozen=True)
class _Block:
    network: IPNetwork
    name: str
    rfc: str


_BLOCKS: tuple[_Block, ...] = tuple(
    sorted(
        (_Block(ipaddress.ip_network(prefix), name, rfc) for prefix, name, rfc in _REGISTRY),
        key=lambda block: -block.network.prefixlen,
    )
)


def reserved_reason(address: IPAddress) -> str | None:
    """Why the CA refuses to connect to ``address`` (Boulder's wording), or None."""
    for block in _BLOCKS:
        if block.network.version == address.version and address in block.network:
            return f"IP address is in a reserved address block: {block.rfc}: {block.name}"
    return None


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses a fetch made as the CA's may connect to: none in a reserved
    block, except those in ``allowed`` (a test rig on loopback, as Boulder's
    ``allowRestrictedAddrs``; empty in production)."""

    allowed: tuple[IPNetwork, ...] = ()

    @classmethod
    def allowing(cls, networks: Iterable[str]) -> AddressPolicy:
        """From CIDR strings; raises ValueError for a malformed one."""
        return cls(tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks if n.strip()))

    def refusal(self, address: IPAddress) -> str | None:
        """Why the CA would not connect to ``address``, or None when it would."""
        reason = reserved_reason(address)
        if reason is None:
            return None
        if any(address.version == n.version and address in n for n in self.allowed):
            return None
        return reason
