"""The updatable dns-01 zone (devstack/dns01zone.py) with certflow's own dns-01 code
(certflow/dns/dns01.py): signed updates land on the primary and reach the
secondary, a wrong key is refused with the server's answer, and the delegation
check reads a customer's CNAME through Unbound."""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Iterator

import pytest

from certflow.dns import dns01
from certflow.dns.checks import DnsChecker
from certflow.dns.lookup import DnsLookupError
from certflow.errors import DnsCheckError, ErrorCode, ProvisioningError
from devstack.dns01zone import Dns01Zone as ZoneServers
from devstack.dns01zone import start_dns01_zone
from devstack.realdns import RealDns, start_real_dns

HOST = "shop.customer.test"


@pytest.fixture(scope="module")
def zone_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZoneServers]:
    servers = start_dns01_zone(tmp_path_factory.mktemp("dns01zone"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def real_dns(tmp_path_factory: pytest.TempPathFactory, zone_servers: ZoneServers) -> Iterator[RealDns]:
    with start_real_dns(tmp_path_factory.mktemp("realdns"), stubs=zone_servers.stub) as server:
        yield server


def _zone(servers: ZoneServers, key: str | None = None) -> dns01.Dns01Zone:
    return dns01.Dns01Zone(
        zone=servers.zone, primary=servers.primary, key=dns01.TsigKey.parse(key or servers.tsig_key)
    )


def _checker(real_dns: RealDns, zone: dns01.Dns01Zone) -> DnsChecker:
    return DnsChecker(real_dns.resolver, "edge.saas.test", "letsencrypt.org", dns01=zone)


async def test_a_signed_update_reaches_every_server_then_is_withdrawn(
    zone_servers: ZoneServers, real_dns: RealDns
) -> None:
    zone = _zone(zone_servers)
    checker = _checker(real_dns, zone)
    label = dns01.delegation_label(HOST)
    await dns01.publish(zone, HOST, "first")
    await dns01.publish(zone, HOST, "second")  # replaces, never adds
    assert zone_servers.txt(label) == ["second"]
    # The secondary transfers after NOTIFY, in its own time: wait on it, with a
    # deadline rather than a count of queries (a loaded machine answers 200
    # queries before Knot has transferred).
    deadline = time.monotonic() + 30
    while missing := await dns01.missing_on(zone, HOST, "second", checker.lookup_ns, checker.lookup_addresses):
        assert time.monotonic() < deadline, f"{missing} still lack the TXT after 30 s"
        await asyncio.sleep(0.05)
    assert zone_servers.txt(label, zone_servers.servers[1]) == ["second"]
    await dns01.withdraw(zone, HOST)
    assert zone_servers.txt(label) == []


async def test_missing_on_names_a_server_that_lacks_the_txt(
    zone_servers: ZoneServers, real_dns: RealDns
) -> None:
    """With the secondary down, the TXT is not on every server: its address is named.

    Unbound, which knew the secondary up a moment ago, may keep asking it for the
    zone's NS (1 s TTL here) past a lookup's 10 s (1 fresh Unbound in 6, probed by
    hand): that lookup fails (DnsLookupError), publish_dns01 is tried again by its
    retry policy, and this test asks again likewise, until the resolver has learnt
    the server is down.
    """
    zone = _zone(zone_servers)
    checker = _checker(real_dns, zone)
    zone_servers.stop_secondary()
    try:
        await dns01.publish(zone, HOST, "while-down")
        deadline = time.monotonic() + 60
        while True:
            try:
                missing = await dns01.missing_on(
                    zone, HOST, "while-down", checker.lookup_ns, checker.lookup_addresses
                )
                break
            except DnsLookupError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)  # a retry's pause, as the activity's
        assert missing == [zone_servers.servers[1]]
    finally:
        zone_servers.start_secondary()


async def test_a_wrong_key_is_refused_and_changes_nothing(zone_servers: ZoneServers) -> None:
    good = _zone(zone_servers)
    await dns01.publish(good, HOST, "kept")
    wrong = f"certflow-dns01:hmac-sha256:{base64.b64encode(secrets.token_bytes(32)).decode()}"
    with pytest.raises(ProvisioningError) as raised:
        await dns01.publish(_zone(zone_servers, wrong), HOST, "forged")
    assert raised.value.code is ErrorCode.DNS01_UPDATE
    assert "refused" in raised.value.message and "\n" not in raised.value.message
    assert zone_servers.txt(dns01.delegation_label(HOST)) == ["kept"]


async def test_the_delegation_is_read_through_the_resolver(
    zone_servers: ZoneServers, real_dns: RealDns
) -> None:
    zone = _zone(zone_servers)
    checker = _checker(real_dns, zone)
    host = f"d{secrets.token_hex(4)}.customer.test"
    with pytest.raises(DnsCheckError) as raised:
        await dns01.check_delegation(host, zone, checker.lookup_cname)
    assert raised.value.code is ErrorCode.DNS_DELEGATION
    assert f"add _acme-challenge.{host} CNAME {zone.target(host)}" in raised.value.message
    real_dns.set_cname(f"_acme-challenge.{host}", "elsewhere.customer.test")
    with pytest.raises(DnsCheckError) as raised:
        await dns01.check_delegation(host, zone, checker.lookup_cname)
    assert "is a CNAME to elsewhere.customer.test" in raised.value.message
    real_dns.set_cname(f"_acme-challenge.{host}", zone.target(host))
    assert "is delegated to" in await dns01.check_delegation(host, zone, checker.lookup_cname)
    # The wildcard shares its base name's delegation.
    assert zone.delegation(f"*.{host}") == zone.delegation(host)
