"""A zone certflow writes dns-01 TXTs into, served the way a real one is.

``start_dns01_zone`` runs two Knot servers for one zone on port 53 of two loopback
addresses: a primary that accepts RFC 2136 updates signed with a TSIG key (the
zone's ``acl``) and NOTIFYs a secondary, which transfers the zone from it (IXFR
once it has it). The zone's NS set names both, so "visible on every authoritative
server" means what it does in production. Pass :attr:`Dns01Zone.stub` to
``start_real_dns(..., stubs=...)`` so that Unbound (and so Pebble, and certflow's
checks) reaches it; give certflow :attr:`primary` and :attr:`tsig_key`.

Binding port 53 needs root (CI and the dev machine run as root).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import base64
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import dns.exception
import dns.message
import dns.name
import dns.query
import dns.rdatatype
import dns.rdtypes.ANY.TXT

from devstack.realdns import RealDns, _find_sbin, start_real_dns
from devstack.servers import PebbleStack, StackError, _Process, _tcp_open, start_pebble

PRIMARY_HOST = "127.0.2.1"
SECONDARY_HOST = "127.0.2.2"
KEY_NAME = "certflow-dns01"
_DEADLINE_S = 30.0
_PROBE_TIMEOUT_S = 0.25


@dataclass
class Dns01Zone:
    """The primary and the secondary Knot of one updatable zone."""

    zone: str
    """The zone's name without the trailing dot, e.g. ``acme.test``."""
    secret: bytes
    workdir: Path
    _processes: list[_Process] = field(default_factory=list)

    @property
    def primary(self) -> str:
        """Where updates go (``CERTFLOW_DNS01_PRIMARY``)."""
        return f"{PRIMARY_HOST}:53"

    @property
    def tsig_key(self) -> str:
        """The key updates are signed with (``CERTFLOW_DNS01_TSIG_KEY``)."""
        return f"{KEY_NAME}:hmac-sha256:{base64.b64encode(self.secret).decode()}"

    @property
    def servers(self) -> tuple[str, str]:
        return (PRIMARY_HOST, SECONDARY_HOST)

    @property
    def stub(self) -> dict[str, list[str]]:
        """For ``start_real_dns(stubs=...)``: Unbound asks these for the zone."""
        return {self.zone: [f"{host}@53" for host in self.servers]}

    def txt(self, name: str, server: str = PRIMARY_HOST) -> list[str]:
        """The TXT strings one server answers for ``name`` (absolute, or a label of
        the zone), asked directly."""
        fqdn = dns.name.from_text(name if name.endswith(self.zone) else f"{name}.{self.zone}")
        query = dns.message.make_query(fqdn, dns.rdatatype.TXT)
        response = dns.query.udp(query, server, port=53, timeout=2.0)
        return [
            b"".join(rdata.strings).decode()
            for rrset in response.answer
            for rdata in rrset
            if isinstance(rdata, dns.rdtypes.ANY.TXT.TXT)
        ]

    def serial(self, server: str) -> int | None:
        query = dns.message.make_query(self.zone + ".", dns.rdatatype.SOA)
        try:
            response = dns.query.udp(query, server, port=53, timeout=_PROBE_TIMEOUT_S)
        except (dns.exception.DNSException, OSError):
            return None
        for rrset in response.answer:
            for rdata in rrset:
                if rdata.rdtype == dns.rdatatype.SOA:
                    return int(rdata.serial)
        return None

    def stop_secondary(self) -> None:
        """Stop the secondary (a server that lags or is down)."""
        self._processes[1].stop()

    def start_secondary(self) -> None:
        self._processes[1].start()
        self._processes[1].wait_ready(lambda: self.serial(SECONDARY_HOST) is not None, _DEADLINE_S)

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()


def _zone_file(zone: str) -> str:
    return f"""\
$ORIGIN {zone}.
$TTL 1
@ 1 IN SOA ns1 hostmaster 1 60 10 86400 1
@ 1 IN NS ns1
@ 1 IN NS ns2
ns1 1 IN A {PRIMARY_HOST}
ns2 1 IN A {SECONDARY_HOST}
"""


def _conf(workdir: Path, host: str, zone: str, secret: bytes, primary: bool) -> str:
    key = base64.b64encode(secret).decode()
    if primary:
        peers = f"""\
remote:
  - id: secondary
    address: {SECONDARY_HOST}@53
    via: {PRIMARY_HOST}
acl:
  - id: update
    key: {KEY_NAME}
    action: update
  - id: transfer
    address: {SECONDARY_HOST}
    action: transfer
"""
        zone_conf = f"""\
  - domain: {zone}.
    file: "{workdir / (zone + '.zone')}"
    notify: secondary
    acl: [update, transfer]
"""
        load = "    zonefile-load: whole\n    journal-content: changes\n"
    else:
        peers = f"""\
remote:
  - id: primary
    address: {PRIMARY_HOST}@53
    via: {SECONDARY_HOST}
acl:
  - id: notify
    address: {PRIMARY_HOST}
    action: notify
"""
        zone_conf = f"""\
  - domain: {zone}.
    master: primary
    acl: notify
"""
        load = "    journal-content: all\n"
    return f"""\
# written by devstack.dns01zone
server:
    rundir: "{workdir}"
    listen: {host}@53
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
control:
    listen: "{workdir / 'knot.sock'}"
log:
  - target: stdout
    any: info
database:
    storage: "{workdir / 'knot-db'}"
key:
  - id: {KEY_NAME}
    algorithm: hmac-sha256
    secret: {key}
{peers}template:
  - id: default
    storage: "{workdir}"
    zonefile-sync: -1
{load}zone:
{zone_conf}"""


def _serving(zone: Dns01Zone, host: str) -> bool:
    return zone.serial(host) is not None


def start_dns01_zone(workdir: Path, zone: str = "acme.test") -> Dns01Zone:
    """Start the zone's primary and secondary; blocks until both serve it."""
    knotd = _find_sbin("knotd")
    zone = zone.strip().lower().rstrip(".")
    workdir = workdir.resolve()
    result = Dns01Zone(zone=zone, secret=secrets.token_bytes(32), workdir=workdir)
    for host in result.servers:
        if _tcp_open(53, host):
            raise StackError(f"knotd cannot start: {host}:53 is already in use")
    for host, primary in ((PRIMARY_HOST, True), (SECONDARY_HOST, False)):
        directory = workdir / ("primary" if primary else "secondary")
        shutil.rmtree(directory, ignore_errors=True)
        (directory / "knot-db").mkdir(parents=True)
        if primary:
            (directory / f"{zone}.zone").write_text(_zone_file(zone))
        (directory / "knot.conf").write_text(_conf(directory, host, zone, result.secret, primary))
        result._processes.append(
            _Process(
                f"knotd-{'primary' if primary else 'secondary'}",
                [knotd, "-c", str(directory / "knot.conf")],
                directory / "knot.log",
            )
        )
    atexit.register(result.stop)
    try:
        for process, host in zip(result._processes, result.servers):
            process.start()
            process.wait_ready(functools.partial(_serving, result, host), _DEADLINE_S)
        deadline = time.monotonic() + _DEADLINE_S
        while result.serial(SECONDARY_HOST) != result.serial(PRIMARY_HOST):
            if time.monotonic() > deadline:
                raise StackError(f"the secondary never transferred {zone}; see {workdir}/secondary/knot.log")
            time.sleep(0.05)
    except BaseException:
        result.stop()
        raise
    return result


@dataclass
class Dns01Servers:
    """What validation over DNS needs, started together: our challenge zone, Knot +
    Unbound for the customers' names (the edge's A record in place), and Pebble
    validating through that resolver."""

    zone: Dns01Zone
    dns: RealDns
    pebble: PebbleStack

    def environment(self) -> dict[str, str]:
        """The worker settings that point certflow at these servers."""
        return {
            "CERTFLOW_DNS_RESOLVER": self.dns.resolver,
            "CERTFLOW_DNS01_ZONE": self.zone.zone,
            "CERTFLOW_DNS01_PRIMARY": self.zone.primary,
            "CERTFLOW_DNS01_TSIG_KEY": self.zone.tsig_key,
        }


def start_dns01_servers(
    workdir: Path, cleanup: contextlib.ExitStack, edge: str, *, authz_reuse_percent: int = 0
) -> Dns01Servers:
    """Start them in ``workdir``; each one's stop is pushed onto ``cleanup``.
    ``authz_reuse_percent``: Pebble's PEBBLE_AUTHZREUSE (100: a new order of the
    same account and name gets the valid authorization back)."""
    zone = start_dns01_zone(workdir / "dns01")
    cleanup.callback(zone.stop)
    dns = start_real_dns(workdir / "dns", stubs=zone.stub)
    cleanup.callback(dns.stop)
    dns.set_a(edge, ["127.0.0.1"])
    pebble = start_pebble(
        workdir / "pebble", nonce_reject_percent=0, dns_server=dns.resolver,
        authz_reuse_percent=authz_reuse_percent,
    )
    cleanup.callback(pebble.stop)
    return Dns01Servers(zone, dns, pebble)
