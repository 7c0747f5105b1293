"""Ownership tokens and the routing check by address (an apex), with lookups faked
(the real ones: tests/e2e/test_ownership.py)."""

from __future__ import annotations

import pytest

from certflow.dns.caa_records import CaaAnswerSet
from certflow.dns.checks import DnsChecker
from certflow.dns.lookup import CnameAnswer, DnsLookupError
from certflow.dns.ownership import check_ownership, ownership_record, ownership_token
from certflow.errors import DnsCheckError, ErrorCode

SECRET = b"s" * 32


def test_a_token_is_stable_and_belongs_to_one_tenant_and_hostname() -> None:
    token = ownership_token(SECRET, "tenant-a", "shop.customer.com")
    assert token == ownership_token(SECRET, "tenant-a", "shop.customer.com")
    assert len(token) == 32 and token.isalnum()
    assert token != ownership_token(SECRET, "tenant-b", "shop.customer.com")
    assert token != ownership_token(SECRET, "tenant-a", "www.customer.com")
    assert token != ownership_token(b"t" * 32, "tenant-a", "shop.customer.com")
    # A wildcard is proven on its base name, as it is validated there.
    assert ownership_record(SECRET, "tenant-a", "*.shop.customer.com") == ownership_record(
        SECRET, "tenant-a", "shop.customer.com"
    )
    assert ownership_record(SECRET, None, "shop.customer.com").name == "_certflow.shop.customer.com"


async def test_the_tenants_record_proves_it_and_another_tenants_does_not() -> None:
    mine = ownership_record(SECRET, "a", "shop.test")
    theirs = ownership_record(SECRET, "b", "shop.test")

    async def lookup(name: str) -> list[str]:
        assert name == "_certflow.shop.test"
        return [theirs.value]

    with pytest.raises(DnsCheckError) as raised:
        await check_ownership("shop.test", "a", SECRET, lookup)
    assert raised.value.code is ErrorCode.OWNERSHIP_UNVERIFIED
    assert f'add _certflow.shop.test TXT "{mine.value}"' in raised.value.message
    assert theirs.value not in raised.value.message  # never shows one tenant another's token
    assert "proves" in await check_ownership("shop.test", "b", SECRET, lookup)


class _Resolver:
    def __init__(self, a: list[str], aaaa: list[str] | None = None, cname: str | None = None) -> None:
        self.a, self.aaaa, self.cname = a, aaaa, cname

    async def lookup_cname(self, name: str) -> list[CnameAnswer]:
        return [CnameAnswer(name, self.cname)] if self.cname else []

    async def lookup_addresses(self, name: str, rdtype: str) -> list[str]:
        found = self.a if rdtype == "A" else self.aaaa
        if found is None:
            raise DnsLookupError(name, rdtype, "SERVFAIL")
        return found

    async def lookup_caa(self, name: str) -> CaaAnswerSet:
        return CaaAnswerSet(cnames=[], caa=[])


def _checker(resolver: _Resolver, edge: frozenset[str]) -> DnsChecker:
    checker = DnsChecker("127.0.0.1:53", "edge.saas.test", "letsencrypt.org", edge_addresses=edge)
    for name in ("lookup_cname", "lookup_addresses", "lookup_caa"):
        object.__setattr__(checker, name, getattr(resolver, name))
    return checker


EDGE = frozenset({"192.0.2.1", "2001:db8::1"})


async def test_an_apex_on_the_edges_addresses_is_routed() -> None:
    found = await _checker(_Resolver(["192.0.2.1"], ["2001:DB8:0::1"]), EDGE).check_cname("customer.test")
    assert found == "customer.test resolves to the edge (192.0.2.1, 2001:DB8:0::1)"
    # One family failing is no failure when the other answers.
    assert "resolves to the edge" in await _checker(_Resolver(["192.0.2.1"], None), EDGE).check_cname("c.test")


async def test_a_partly_moved_hostname_is_refused_naming_the_foreign_addresses() -> None:
    with pytest.raises(DnsCheckError) as raised:
        await _checker(_Resolver(["192.0.2.1", "203.0.113.9"], []), EDGE).check_cname("customer.test")
    assert raised.value.code is ErrorCode.DNS_CNAME
    assert "partly moved" in raised.value.message and "203.0.113.9, which the CA may reach" in raised.value.message


async def test_foreign_addresses_or_none_are_refused_as_before() -> None:
    with pytest.raises(DnsCheckError) as raised:
        await _checker(_Resolver(["203.0.113.9"], []), EDGE).check_cname("customer.test")
    assert "it resolves to 203.0.113.9" in raised.value.message
    with pytest.raises(DnsCheckError) as none:
        await _checker(_Resolver([], []), EDGE).check_cname("customer.test")
    assert "has no CNAME record" in none.value.message and "or A/AAAA records of the edge" in none.value.message
    with pytest.raises(DnsCheckError) as without:  # no EDGE_ADDRESSES: the CNAME rule alone
        await _checker(_Resolver(["192.0.2.1"], []), frozenset()).check_cname("customer.test")
    assert without.value.message == "customer.test has no CNAME record; expected a CNAME to edge.saas.test"
