"""The updatable dns-01 zone (devstack/dns01zone.py) with certflow's own dns-01 code
(certflow/dns/dns01.py): signed updates land on the primary and reach the
secondary, two values share a label (a name's and its wildcard's) and each goes
alone, Knot refuses an update whose prerequisite no longer holds, a wrong key is
refused with the server's answer, and the delegation check reads a customer's
CNAME through Unbound."""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Iterator

import pytest

from certflow.dns.tsig import TsigKey
from certflow.dns import dns01
from certflow.dns.checks import DnsChecker
from certflow.dns.lookup import DnsLookupError
from certflow.errors import DnsCheckError, ErrorCode, ProvisioningError
from devstack.dns01zone import Dns01Zone as ZoneServers
from devstack.dns01zone import start_dns01_zone
from devstack.realdns import RealDns, start_real_dns

pytestmark = pytest.mark.e2e  # real binaries: out of the fast tier

HOST = "shop.customer.test"


def _in_use(*values: str) -> dns01.InUse:
    """Postgres's answer, fixed: the values of the open orders at the label."""

    async def read() -> set[str]:
        return set(values)

    return read


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
        zone=servers.zone, primary=servers.primary, key=TsigKey.parse(key or servers.tsig_key)
    )


def _checker(real_dns: RealDns, zone: dns01.Dns01Zone) -> DnsChecker:
    return DnsChecker(real_dns.resolver, "edge.saas.test", "letsencrypt.org", dns01=zone)


async def test_a_signed_update_reaches_every_server_then_is_withdrawn(
    zone_servers: ZoneServers, real_dns: RealDns
) -> None:
    zone = _zone(zone_servers)
    checker = _checker(real_dns, zone)
    label = dns01.delegation_label(HOST)
    await dns01.publish(zone, HOST, "first", _in_use("first"))
    # The next attempt's value: the first, in use no more, is a leftover it deletes.
    await dns01.publish(zone, HOST, "second", _in_use("second"))
    assert zone_servers.txt(label) == ["second"]
    # The secondary transfers after NOTIFY, in its own time: wait on it, with a
    # deadline rather than a count of queries (a loaded machine answers 200
    # queries before Knot has transferred).
    deadline = time.monotonic() + 30
    while missing := await dns01.missing_on(zone, HOST, "second", checker.lookup_ns, checker.lookup_addresses):
        assert time.monotonic() < deadline, f"{missing} still lack the TXT after 30 s"
        await asyncio.sleep(0.05)
    assert zone_servers.txt(label, zone_servers.servers[1]) == ["second"]
    assert await dns01.withdraw(zone, HOST, _in_use()) == ["second"]
    assert zone_servers.txt(label) == []


async def _on_every_server(zone_servers: ZoneServers, label: str, values: list[str]) -> None:
    deadline = time.monotonic() + 30
    while any(sorted(zone_servers.txt(label, server)) != values for server in zone_servers.servers):
        assert time.monotonic() < deadline, [zone_servers.txt(label, s) for s in zone_servers.servers]
        await asyncio.sleep(0.05)


async def test_a_name_and_its_wildcard_share_the_label_and_each_goes_alone(
    zone_servers: ZoneServers, real_dns: RealDns
) -> None:
    """Issue 39 on Knot: the wildcard's publish adds its value next to the name's
    (its answer: shared), both reach the secondary, and the name's withdraw deletes
    its own value only, on both servers."""
    zone = _zone(zone_servers)
    checker = _checker(real_dns, zone)
    host = f"p{secrets.token_hex(4)}.customer.test"
    label = dns01.delegation_label(host)
    assert await dns01.publish(zone, host, "name-1", _in_use("name-1", "wild-1")) is False
    assert await dns01.publish(zone, f"*.{host}", "wild-1", _in_use("name-1", "wild-1")) is True
    await _on_every_server(zone_servers, label, ["name-1", "wild-1"])
    for value in ("name-1", "wild-1"):  # each workflow's own check: its value among the two
        assert await dns01.missing_on(zone, host, value, checker.lookup_ns, checker.lookup_addresses) == []
    assert await dns01.withdraw(zone, host, _in_use("wild-1")) == ["name-1"]
    await _on_every_server(zone_servers, label, ["wild-1"])
    assert await dns01.withdraw(zone, f"*.{host}", _in_use()) == ["wild-1"]
    await _on_every_server(zone_servers, label, [])


async def test_knot_refuses_an_update_whose_label_changed_since_it_was_read(
    zone_servers: ZoneServers,
) -> None:
    """The prerequisites ``publish`` relies on, as Knot applies them: "exactly these
    values" and "no TXT" both fail (nothing changed) once another value is there."""
    zone = _zone(zone_servers)
    host = f"r{secrets.token_hex(4)}.customer.test"
    label = dns01.delegation_label(host)
    assert await dns01._send(zone, dns01.publish_update(zone, host, "theirs", []), "add") is True
    assert await dns01._send(zone, dns01.publish_update(zone, host, "mine", []), "add") is False
    assert await dns01._send(zone, dns01.publish_update(zone, host, "mine", ["old"]), "add") is False
    assert await dns01._send(zone, dns01.publish_update(zone, host, "mine", ["theirs", "x"]), "add") is False
    assert zone_servers.txt(label) == ["theirs"]
    assert await dns01._send(zone, dns01.publish_update(zone, host, "mine", ["theirs"]), "add") is True
    assert sorted(zone_servers.txt(label)) == ["mine", "theirs"]
    assert sorted(await dns01.withdraw(zone, host, _in_use())) == ["mine", "theirs"]
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
        await dns01.publish(zone, HOST, "while-down", _in_use("while-down"))
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
    await dns01.publish(good, HOST, "kept", _in_use("kept"))
    wrong = f"certflow-dns01:hmac-sha256:{base64.b64encode(secrets.token_bytes(32)).decode()}"
    with pytest.raises(ProvisioningError) as raised:
        await dns01.publish(_zone(zone_servers, wrong), HOST, "forged", _in_use("kept", "forged"))
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
