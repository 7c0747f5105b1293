"""The DNS pre-checks of one hostname before an order (SPEC §3.1): the CNAME chain to
the edge and CAA for every configured CA, against the configured resolver."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import dns.rcode
import dns.rdatatype

from certflow.dns.caa import (
    _ISSUER_DOMAIN_RE,
    CaaAnswerSet,
    CaaIssuer,
    allowed_issuers,
    parse_caa_response,
)
from certflow.dns.cname import follow_cname_chain
from certflow.dns.lookup import (
    DNS_TIMEOUT_SECONDS,
    CnameAnswer,
    DnsLookupError,
    _ca_detail,
    canonical as _canonical,
    cname_answers,
    parse_resolver_address,
    query,
    rrsets,
    unique as _unique,
)
from certflow.errors import ConfigError
from certflow.hostnames import InvalidHostnameError, normalize_hostname
from certflow.issuers import DEFAULT_ISSUER
from certflow.models import DnsVerdict


@dataclass(frozen=True)
class DnsChecker:
    """SPEC §3.1 DNS checks against one resolver.

    ``resolver`` is ``host:port``; ``cname_target`` the edge name customers
    must alias; ``caa_issuer_domain`` the CA's CAA issuer-domain (e.g.
    ``letsencrypt.org``); ``account_uri`` our registered ACME account URL at
    that CA, for RFC 8657 ``accounturi`` (``None`` while unknown: a CAA value
    bound to an account then authorizes nothing). Invalid settings raise
    ``ConfigError`` at construction.
    """

    resolver: str
    cname_target: str
    caa_issuer_domain: str
    timeout: float = DNS_TIMEOUT_SECONDS
    account_uri: str | None = None
    issuers: tuple[tuple[str, CaaIssuer], ...] | Callable[[], tuple[tuple[str, CaaIssuer], ...]] = ()
    """Every configured CA as (issuer name, CA as CAA sees it), in order of
    preference, or a function giving them as they are now (an account registered
    after start-up brings its URL for RFC 8657); empty: the one CA of
    ``caa_issuer_domain`` and ``account_uri``."""

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
        object.__setattr__(self, "account_uri", self.account_uri or None)
        if self.timeout <= 0:
            raise ConfigError(f"DNS timeout must be positive, got {self.timeout!r}")

    @property
    def caa_issuer(self) -> CaaIssuer:
        """The CA as CAA sees it: ``caa_issuer_domain`` and ``account_uri``."""
        return CaaIssuer((self.caa_issuer_domain,), self.account_uri)

    @property
    def caa_issuers(self) -> tuple[tuple[str, CaaIssuer], ...]:
        """Every CA CAA is judged for, by issuer name, in order of preference."""
        listed = self.issuers() if callable(self.issuers) else self.issuers
        return listed or ((DEFAULT_ISSUER, self.caa_issuer),)

    async def check(self, hostname: str) -> DnsVerdict:
        """Run the CNAME check, then the CAA check, for ``hostname``: the names of
        the issuers CAA allows, in order of preference, and the CAA set as read.

        Raises ``DnsCheckError`` (DNS_CNAME, DNS_CAA or ACME_TEMPORARY), or
        ``InvalidHostnameError`` when ``hostname`` is not a valid name at all.
        """
        await self.check_cname(hostname)
        allowed = await allowed_issuers(
            normalize_hostname(hostname), self.caa_issuers, self.lookup_caa
        )
        return DnsVerdict(allowed_issuers=allowed.names, caa_reading=allowed.reading)

    async def check_cname(self, hostname: str) -> str:
        """The CNAME check alone; what was found when it passes."""
        host = normalize_hostname(hostname)
        await follow_cname_chain(host, self.cname_target, self.lookup_cname)
        return f"{host} aliases {self.cname_target}"

    async def check_caa(self, hostname: str) -> str:
        """The CAA check alone; the verdict's reason when it allows one of our CAs."""
        allowed = await allowed_issuers(
            normalize_hostname(hostname), self.caa_issuers, self.lookup_caa
        )
        reason = allowed.reason
        if len(self.caa_issuers) > 1:
            reason += f" (issuers allowed: {', '.join(allowed.names)})"
        return reason

    async def lookup_cname(self, name: str) -> list[CnameAnswer]:
        """The CNAME records in the resolver's answer for ``name`` (any owner)."""
        response = await query(
            name, dns.rdatatype.CNAME, parse_resolver_address(self.resolver), self.timeout
        )
        return cname_answers(response)

    async def lookup_addresses(self, name: str, rdtype: str) -> list[str]:
        """The addresses of one family (``A`` or ``AAAA``) a query for ``name`` ends
        at (the resolver follows CNAMEs), in the order answered. As Let's Encrypt's
        resolver client, NXDOMAIN is a failed lookup here: DnsLookupError."""
        kind = dns.rdatatype.from_text(rdtype)
        response = await query(name, kind, parse_resolver_address(self.resolver), self.timeout)
        if response.rcode() == dns.rcode.NXDOMAIN:
            raise DnsLookupError(
                name, rdtype, "NXDOMAIN", _ca_detail(rdtype, name, rcode=dns.rcode.NXDOMAIN)
            )
        return _unique(rdata.to_text() for rrset in rrsets(response, kind) for rdata in rrset)

    async def lookup_caa(self, name: str) -> CaaAnswerSet:
        """The CNAME chain and CAA records in the resolver's answer for ``name``."""
        response = await query(
            name, dns.rdatatype.CAA, parse_resolver_address(self.resolver), self.timeout
        )
        return parse_caa_response(response)
