"""The DNS pre-checks of one hostname before an order (docs/lifecycle.md, "Before the CA is asked"), against the
configured resolver: which validation method is ready (a persist record, the
delegation of ``_acme-challenge`` into our zone, the CNAME to the edge), and CAA
for every configured CA and that method."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

import dns.rcode
import dns.rdatatype
import dns.rdtypes.ANY.NS
import dns.rdtypes.ANY.TXT

from certflow.dns.caa_records import ISSUER_DOMAIN_RE, CaaAnswerSet, parse_caa_response
from certflow.dns.caa_methods import caa_by_method
from certflow.dns.caa_verdict import CaaIssuer, allowed_issuers
from certflow.dns.cname import follow_cname_chain
from certflow.dns.dns01 import Dns01Zone, check_delegation, probe
from certflow.dns.ownership import check_ownership
from certflow.dns.persist import check_persist, persist_record
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
from certflow.errors import ConfigError, DnsCheckError, ErrorCode, ProvisioningError
from certflow.hostnames import InvalidHostnameError, is_wildcard, normalize_hostname
from certflow.issuers import DEFAULT_ISSUER
from certflow.models import DnsRecord, MethodReadiness, RequestedMethod, ValidationMethod
from certflow.activity_payloads import DnsVerdict


@dataclass(frozen=True)
class DnsChecker:
    """The DNS checks before an order, against one resolver (docs/lifecycle.md,
    "Before the CA is asked").

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
    dns01: Dns01Zone | None = None
    """Delegated dns-01's zone (None: dns-01 is never ready)."""
    edge_addresses: frozenset[str] = frozenset()
    """The edge's IPv4 and IPv6 addresses (``EDGE_ADDRESSES``): a hostname whose every
    A/AAAA address is one of them is routed to the edge without a CNAME (an apex)."""
    persist_issuers: frozenset[str] = frozenset()
    """The issuers (by name) that offer dns-persist-01 (the issuer setting
    ``dns_persist``); none: dns-persist-01 is never ready."""
    ownership_secret: bytes | None = None
    """``OWNERSHIP_SECRET``: the key of the tenants' ownership tokens."""
    require_ownership: bool = False
    """``REQUIRE_OWNERSHIP``: no order before the row's tenant has proven ownership."""

    def __post_init__(self) -> None:
        parse_resolver_address(self.resolver)
        try:
            target = normalize_hostname(self.cname_target)
        except InvalidHostnameError as exc:
            raise ConfigError(f"CNAME target: {exc}") from None
        # Frozen: normalize in place once, so messages show the canonical name.
        object.__setattr__(self, "cname_target", target)
        issuer = _canonical(self.caa_issuer_domain)
        if not ISSUER_DOMAIN_RE.fullmatch(issuer):
            raise ConfigError(
                f"CAA issuer domain {self.caa_issuer_domain!r} is not a valid "
                "RFC 8659 issuer-domain-name"
            )
        object.__setattr__(self, "caa_issuer_domain", issuer)
        object.__setattr__(self, "account_uri", self.account_uri or None)
        try:
            edge = frozenset(str(ipaddress.ip_address(a.strip())) for a in self.edge_addresses)
        except ValueError as exc:
            raise ConfigError(f"edge addresses: {exc}") from None
        object.__setattr__(self, "edge_addresses", edge)
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

    async def check(
        self,
        hostname: str,
        requested: RequestedMethod = RequestedMethod.AUTO,
        tenant_id: str | None = None,
    ) -> DnsVerdict:
        """Which validation methods are ready for ``hostname`` (the one requested,
        or with ``auto`` each in order: dns-persist-01, dns-01, http-01), then CAA:
        the issuers it allows, in order of preference, for the first ready method
        it allows; the methods ready, and the CAA set as read.

        With ``require_ownership``, first the proof that ``tenant_id`` owns the
        hostname. Raises ``DnsCheckError`` (OWNERSHIP_UNVERIFIED, DNS_CNAME,
        DNS_DELEGATION, DNS_PERSIST, DNS_CAA or ACME_TEMPORARY), or
        ``InvalidHostnameError`` when ``hostname`` is not a valid name at all.
        """
        host = normalize_hostname(hostname)
        if self.require_ownership and self.ownership_secret is not None:
            await check_ownership(host, tenant_id, self.ownership_secret, self.lookup_txt)
        ready: list[tuple[ValidationMethod, str, list[str] | None]] = []
        failures: list[tuple[ValidationMethod, DnsCheckError]] = []
        for method in self.candidates(host, requested):
            try:
                reason, only = await self._ready(host, method)
            except DnsCheckError as err:
                failures.append((method, err))
            else:
                ready.append((method, reason, only))
        if not ready:
            raise self._none_ready(host, requested, failures)
        while True:
            allowed = await allowed_issuers(
                host, self.caa_issuers, self.lookup_caa, [str(m) for m, _, _ in ready]
            )
            method, reason, only = next(r for r in ready if str(r[0]) == allowed.method)
            names = [n for n in allowed.names if only is None or n in only]
            if names:
                break
            # A persist record for CAs that CAA does not allow: the next method may do.
            refused = DnsCheckError(
                ErrorCode.DNS_PERSIST,
                f"{reason}, but CAA allows none of the CAs it names ({', '.join(only or [])})",
            )
            ready.remove((method, reason, only))
            if not ready:
                raise refused
        # Handed on only as far as CAA lets every allowed CA validate with them: an
        # order falls back to a later method when the CA offers no challenge of
        # the first, and the CA judges CAA for the method that validates.
        methods = [method, *(m for m, _, _ in ready if str(m) in allowed.fallbacks)]
        return DnsVerdict(
            allowed_issuers=names, caa_reading=allowed.reading, methods=methods, method_reason=reason
        )

    async def readiness(self, hostname: str) -> list[MethodReadiness]:
        """Each validation method this deployment offers: ready or not for
        ``hostname``, and the exact record the customer adds for it (``check``,
        ``status``: what a product shows next to a "verify" button)."""
        host = normalize_hostname(hostname)
        found: list[MethodReadiness] = []
        for method in (ValidationMethod.HTTP_01, ValidationMethod.DNS_01, ValidationMethod.DNS_PERSIST_01):
            record = self.record_for(host, method)
            try:
                detail, _ = await self._ready(host, method)
            except DnsCheckError as err:
                if _not_set_up(err):
                    continue
                found.append(MethodReadiness(method=method, ready=False, detail=err.message, record=record))
            else:
                found.append(MethodReadiness(method=method, ready=True, detail=detail, record=record))
        verdicts = await caa_by_method(host, self.caa_issuers, self.lookup_caa, [str(m.method) for m in found])
        return [
            m.model_copy(update={"caa_allowed": verdicts[m.method][0], "caa": verdicts[m.method][1]})
            for m in found
        ]

    def record_for(self, hostname: str, method: ValidationMethod) -> DnsRecord | None:
        """The record a customer adds so that ``method`` is ready (None: this
        deployment cannot say, e.g. no CA offers dns-persist-01)."""
        if method is ValidationMethod.HTTP_01:
            return None if is_wildcard(hostname) else DnsRecord(name=hostname, type="CNAME", value=self.cname_target)
        if method is ValidationMethod.DNS_01:
            return None if self.dns01 is None else self.dns01.delegation(hostname)
        for name, issuer in self.caa_issuers:
            if name in self.persist_issuers and issuer.account_uri and issuer.domains:
                return persist_record(hostname, issuer.domains[0], issuer.account_uri)
        return None

    def candidates(self, hostname: str, requested: RequestedMethod) -> list[ValidationMethod]:
        """The methods to try, in order of preference."""
        if requested is not RequestedMethod.AUTO:
            return [ValidationMethod(str(requested))]
        order = [ValidationMethod.DNS_PERSIST_01, ValidationMethod.DNS_01, ValidationMethod.HTTP_01]
        if is_wildcard(hostname):
            order.remove(ValidationMethod.HTTP_01)  # a CA never validates a wildcard over HTTP
        return order

    async def _ready(self, host: str, method: ValidationMethod) -> tuple[str, list[str] | None]:
        """Why ``method`` is ready for ``host``, and the issuers it is ready for (None:
        any); DnsCheckError when it is not."""
        if method is ValidationMethod.HTTP_01:
            if is_wildcard(host):
                raise DnsCheckError(
                    ErrorCode.DNS_CNAME,
                    f"{host} is a wildcard: a CA validates it over DNS only (dns-01 or dns-persist-01)",
                )
            return await self.check_cname(host), None
        if method is ValidationMethod.DNS_01:
            if self.dns01 is None:
                raise DnsCheckError(ErrorCode.DNS_DELEGATION, _NO_DNS01)
            delegated = await check_delegation(host, self.dns01, self.lookup_cname)
            try:
                await probe(self.dns01)  # our side too, before any order is placed
            except ProvisioningError as err:
                raise DnsCheckError(err.code, err.message) from None
            return delegated, None
        offering = [(n, i) for n, i in self.caa_issuers if n in self.persist_issuers]
        if not offering:
            raise DnsCheckError(ErrorCode.DNS_PERSIST, _NO_PERSIST_CA)
        found: list[tuple[str, str]] = []
        errors: list[DnsCheckError] = []
        for name, issuer in offering:
            try:
                reason = await check_persist(host, issuer.domains, issuer.account_uri, self.lookup_txt)
            except DnsCheckError as err:
                errors.append(err)
            else:
                found.append((name, reason))
        if not found:
            raise errors[0]
        return found[0][1], [name for name, _ in found]

    def _none_ready(
        self,
        host: str,
        requested: RequestedMethod,
        failures: list[tuple[ValidationMethod, DnsCheckError]],
    ) -> DnsCheckError:
        """No method ready: the requested one's error; with ``auto``, the routing
        check's (the edge's CNAME, as before DNS validation), naming what else
        would do, or for a wildcard the DNS methods' errors."""
        if requested is not RequestedMethod.AUTO or len(failures) == 1:
            return failures[0][1]
        by_method = dict(failures)
        http = by_method.get(ValidationMethod.HTTP_01)
        others = [
            f"{method}: {err.message}"
            for method, err in failures
            if method is not ValidationMethod.HTTP_01 and not _not_set_up(err)
        ]
        if http is not None:
            if others:
                http.message += "; or, before the traffic moves: " + "; ".join(others)
            return http
        first = next((err for _, err in failures if not _not_set_up(err)), failures[0][1])
        first.message = "; ".join(f"{method}: {err.message}" for method, err in failures)
        return first

    async def check_cname(self, hostname: str) -> str:
        """The routing check (http-01): ``hostname`` aliases ``cname_target``, or —
        for an apex, which cannot be a CNAME, or any name on A/AAAA records — every
        address it resolves to is one of ``edge_addresses``; what was found when it
        passes. A partly moved hostname (some addresses ours, some not) is refused
        naming the others: the CA may reach either."""
        host = normalize_hostname(hostname)
        try:
            await follow_cname_chain(host, self.cname_target, self.lookup_cname)
        except DnsCheckError as err:
            if not self.edge_addresses:
                raise
            return await self._routed_by_address(host, err)
        return f"{host} aliases {self.cname_target}"

    async def _routed_by_address(self, host: str, no_alias: DnsCheckError) -> str:
        addresses: list[str] = []
        failures: list[str] = []
        for family in ("A", "AAAA"):
            try:
                addresses += await self.lookup_addresses(host, family)
            except DnsLookupError as err:
                failures.append(err.reason)
        edge = sorted(self.edge_addresses)
        if not addresses:
            no_alias.message += f"; or A/AAAA records of the edge ({', '.join(edge)})"
            raise no_alias
        ours = [a for a in addresses if _address(a) in self.edge_addresses]
        foreign = [a for a in addresses if _address(a) not in self.edge_addresses]
        if foreign and ours:
            raise DnsCheckError(
                ErrorCode.DNS_CNAME,
                f"{host} is partly moved: it resolves to {', '.join(ours)} (ours) and to"
                f" {', '.join(foreign)}, which the CA may reach instead; point every"
                f" A/AAAA record at the edge ({', '.join(edge)})",
                found=addresses,
                expected=", ".join(edge),
            )
        if foreign:
            raise DnsCheckError(
                ErrorCode.DNS_CNAME,
                f"{no_alias.message}; or A/AAAA records of the edge ({', '.join(edge)}):"
                f" it resolves to {', '.join(foreign)}",
                found=addresses,
                expected=", ".join(edge),
            )
        return f"{host} resolves to the edge ({', '.join(ours)})"

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

    async def lookup_txt(self, name: str) -> list[str]:
        """The TXT records at ``name`` (the resolver follows CNAMEs), each record's
        character-strings joined; none for NXDOMAIN."""
        response = await query(
            name, dns.rdatatype.TXT, parse_resolver_address(self.resolver), self.timeout
        )
        return [
            b"".join(rdata.strings).decode("utf-8", "backslashreplace")
            for rrset in rrsets(response, dns.rdatatype.TXT)
            for rdata in rrset
            if isinstance(rdata, dns.rdtypes.ANY.TXT.TXT)
        ]

    async def lookup_ns(self, zone: str) -> list[str]:
        """The NS names of ``zone``, through the resolver."""
        response = await query(
            zone, dns.rdatatype.NS, parse_resolver_address(self.resolver), self.timeout
        )
        return _unique(
            _canonical(rdata.target.to_text())
            for rrset in rrsets(response, dns.rdatatype.NS)
            for rdata in rrset
            if isinstance(rdata, dns.rdtypes.ANY.NS.NS)
        )

    async def lookup_caa(self, name: str) -> CaaAnswerSet:
        """The CNAME chain and CAA records in the resolver's answer for ``name``."""
        response = await query(
            name, dns.rdatatype.CAA, parse_resolver_address(self.resolver), self.timeout
        )
        return parse_caa_response(response)


_NO_DNS01 = "dns-01 is not set up on this worker (CERTFLOW_DNS01_ZONE, _PRIMARY, _TSIG_KEY)"
_NO_PERSIST_CA = "no configured CA offers dns-persist-01 (the issuer setting dns_persist)"


def _not_set_up(err: DnsCheckError) -> bool:
    """A method this deployment does not offer: nothing a customer could fix."""
    return err.message in (_NO_DNS01, _NO_PERSIST_CA)


def _address(text: str) -> str:
    """An address in one spelling (``2001:DB8::1`` and ``2001:db8:0::1`` are one)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text
