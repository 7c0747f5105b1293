"""A hostname belongs to one tenant, proven; apex domains routed by address — on real
DNS (Knot + Unbound, resolving for certflow and for Pebble), the fault proxy in front
of Pebble counting what the CA was asked, a worker with ``REQUIRE_OWNERSHIP``.

Every wait is on a condition (the row, the CA's counts)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from certflow.product.client import CertflowClient
from certflow.errors import HostnameOwnedError
from certflow.crypto import EncryptionKey
from certflow.edge.serving import SniCertificates
from devstack import servers
from devstack.faultproxy import FaultProxy, start_fault_proxy
from devstack.realdns import RealDns, start_real_dns
from tests.e2e.fault_fixtures import SHORT_POLICY, client_of, metric_value, scrape_metrics, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EDGE = "edge.saas.test"
EDGE_ADDRESSES = ("127.0.0.1", "127.0.0.8")  # the responder listens on every loopback address
FOREIGN = "127.0.0.9"
PENDING_TIMEOUT_S = 35.0
DEPARTED_RETENTION_S = 10.0
EXPIRES_IN_S = 20.0
"""How far ahead the departing hostname's expiry is brought (Pebble's certificates
last years): long enough for its renewal to find the CNAME gone first."""


@dataclass
class OwnershipStack:
    dns: RealDns
    pebble: servers.PebbleStack
    proxy: FaultProxy
    temporal: servers.TemporalDevServer
    env: dict[str, str]
    worker: servers.WorkerProcess

    def client_env(self) -> dict[str, str]:
        keep = ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE", "CERTFLOW_OWNERSHIP_SECRET")
        return {k: self.env[k] for k in keep} | {"PATH": "/usr/bin:/bin"}

    def hostname(self, label: str) -> str:
        host = f"{label}.o{uuid.uuid4().hex[:8]}.test"
        self.dns.set_cname(host, EDGE)
        return host

    def prove(self, client: CertflowClient, hostname: str, tenant: str) -> None:
        record = client.ownership_record(hostname, tenant)
        assert record is not None
        self.dns.set_records(record.name, "TXT", [f'"{record.value}"'])


@pytest.fixture(scope="module")
def stack(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OwnershipStack]:
    workdir = tmp_path_factory.mktemp("ownership")
    with contextlib.ExitStack() as cleanup:
        dns = start_real_dns(workdir / "dns")
        cleanup.callback(dns.stop)
        dns.set_a(EDGE, ["127.0.0.1"])
        pebble = servers.start_pebble(
            workdir / "pebble", nonce_reject_percent=0, dns_server=dns.resolver, authz_reuse_percent=0
        )
        cleanup.callback(pebble.stop)
        proxy = start_fault_proxy(pebble, workdir / "pebble")
        cleanup.callback(proxy.stop)
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=new_database("certflow_ownership"),
            encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
            cname_target=EDGE,
            task_queue=f"certflow-owner-{uuid.uuid4().hex[:8]}",
            extra={
                "CERTFLOW_DNS_RESOLVER": dns.resolver,
                "CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url,
                "CERTFLOW_HTTP01_LISTEN": f"0.0.0.0:{pebble.http01_port}",
                "CERTFLOW_EDGE_ADDRESSES": ",".join(EDGE_ADDRESSES),
                "CERTFLOW_REQUIRE_OWNERSHIP": "true",
                "CERTFLOW_OWNERSHIP_SECRET": base64.b64encode(secrets.token_bytes(32)).decode(),
                # A hostname never made ready is given up on after ~35 s here (14 days
                # in production); every other test here is ready long before.
                "CERTFLOW_PENDING_TIMEOUT_DAYS": str(PENDING_TIMEOUT_S / 86400),
                # Only an expired hostname no longer routed to us reads it (one test).
                "CERTFLOW_DEPARTED_RETENTION_DAYS": str(DEPARTED_RETENTION_S / 86400),
                "CERTFLOW_METRICS_LISTEN": f"127.0.0.1:{servers.free_port()}",
                **SHORT_POLICY,
            },
        )
        worker = servers.start_worker(workdir / "workers", env)
        cleanup.callback(worker.stop)
        yield OwnershipStack(dns, pebble, proxy, temporal, env, worker)


def _given_up(stack: OwnershipStack, reason: str) -> float:
    """The worker's ``certflow_certificates_given_up_total`` for one reason."""
    return metric_value(scrape_metrics(stack.env), "certflow_certificates_given_up_total", reason=reason)


@pytest.fixture(scope="module")
async def client(stack: OwnershipStack) -> AsyncIterator[CertflowClient]:
    async with client_of(stack.env) as opened:
        yield opened


async def test_without_the_tenants_proof_nothing_reaches_the_ca(
    stack: OwnershipStack, client: CertflowClient
) -> None:
    """REQUIRE_OWNERSHIP: routed to the edge but no ``_certflow`` TXT of its tenant:
    OWNERSHIP_UNVERIFIED naming the record, budget untouched, 0 orders; issued within
    a re-check once the record appears.

    Shown red: with the ownership check taken out of DnsChecker.check, the
    certificate was issued at once and OWNERSHIP_UNVERIFIED never showed."""
    hostname = stack.hostname("proof")
    await client.request([hostname], tenant_id="tenant-a")
    report = await wait_for(client, hostname, lambda r: r.error_code == "OWNERSHIP_UNVERIFIED", timeout=60)
    record = client.ownership_record(hostname, "tenant-a")
    assert record is not None and f'{record.name} TXT "{record.value}"' in (report.error_message or "")
    assert report.retry_count == 0 and stack.proxy.new_orders_for(hostname) == 0
    status = await client.status(hostname)
    assert status is not None and status.ownership == record
    stack.prove(client, hostname, "tenant-a")
    await wait_for(client, hostname, lambda r: r.status == "ACTIVE", timeout=60)
    assert stack.proxy.new_orders_for(hostname) == 1


async def test_a_transfer_needs_the_new_tenants_proof_and_keeps_serving_until_reissued(
    stack: OwnershipStack, client: CertflowClient
) -> None:
    """Another tenant's request is refused; ``transfer --to`` without the new tenant's
    record exits 1 with one line and changes nothing; with it the hostname moves, the
    old certificate is served until the new one (a new key, a new order) is stored.

    Shown red: with ``check_ownership`` taken out of ``transfer_certificate``
    (activities/dns.py), ``transfer --to`` without the TXT exited 0 ("belongs to
    tenant-b now")."""
    hostname = stack.hostname("moving")
    stack.prove(client, hostname, "tenant-a")
    await client.request([hostname], tenant_id="tenant-a")
    first = await wait_for(client, hostname, lambda r: r.status == "ACTIVE", timeout=60)
    with pytest.raises(HostnameOwnedError):
        await client.request([hostname], tenant_id="tenant-b")

    refused = subprocess.run(
        [sys.executable, "starter.py", "transfer", hostname, "--to", "tenant-b"],
        cwd=ROOT, env=stack.client_env(), capture_output=True, text=True, timeout=120,
    )
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused
    assert "not proven" in refused.stderr
    row = await client.pool.fetchrow("SELECT tenant_id FROM certificates WHERE hostname = $1", hostname)
    assert row is not None and row["tenant_id"] == "tenant-a"

    key = EncryptionKey(base64.b64decode(stack.env["CERTFLOW_ENCRYPTION_KEY"]))
    edge = SniCertificates(client.pool, key)
    await edge.refresh()
    assert edge.serial_for(hostname) == first.serial
    stack.prove(client, hostname, "tenant-b")
    moved = subprocess.run(
        [sys.executable, "starter.py", "transfer", hostname, "--to", "tenant-b"],
        cwd=ROOT, env=stack.client_env(), capture_output=True, text=True, timeout=120,
    )
    assert moved.returncode == 0, moved
    await edge.refresh()
    assert edge.serial_for(hostname) == first.serial  # served until the new one is stored
    renewed = await wait_for(
        client, hostname, lambda r: r.status == "ACTIVE" and r.serial != first.serial, timeout=90
    )
    await edge.refresh()
    assert edge.serial_for(hostname) == renewed.serial
    assert renewed.tenant_id == "tenant-b" and stack.proxy.new_orders_for(hostname) == 2
    events = [e.message for e in await client.events(hostname)]
    assert any("transferred to tenant tenant-b from tenant-a" in (m or "") for m in events), events


async def test_an_apex_on_the_edges_addresses_issues(stack: OwnershipStack, client: CertflowClient) -> None:
    """An apex (no CNAME possible) whose A records are the edge's: ACTIVE, one order.

    Shown red: with the address branch of the routing check taken out (a missing
    alias always refused), the apex waited on DNS_CNAME until abandoned."""
    apex = f"o{uuid.uuid4().hex[:8]}.test"
    stack.dns.set_a(apex, list(EDGE_ADDRESSES))
    stack.prove(client, apex, "tenant-apex")
    await client.request([apex], tenant_id="tenant-apex")
    await wait_for(client, apex, lambda r: r.status == "ACTIVE", timeout=60)
    assert stack.proxy.new_orders_for(apex) == 1


async def test_a_partly_moved_apex_is_refused_naming_the_foreign_address(
    stack: OwnershipStack, client: CertflowClient
) -> None:
    """One A record ours, one not: the CA may reach either, so no order is placed.

    Shown red: with the partly-moved branch removed from DnsChecker (any address of
    ours passing), the order was placed and issued — here the CA happened to reach
    the address of ours."""
    apex = f"o{uuid.uuid4().hex[:8]}.test"
    stack.dns.set_a(apex, [EDGE_ADDRESSES[0], FOREIGN])
    stack.prove(client, apex, "tenant-apex")
    await client.request([apex], tenant_id="tenant-apex")
    report = await wait_for(client, apex, lambda r: r.error_code == "DNS_CNAME", timeout=60)
    assert "partly moved" in (report.error_message or "") and FOREIGN in (report.error_message or "")
    assert stack.proxy.new_orders_for(apex) == 0
    await client.cancel(apex)


@dataclass(frozen=True)
class NeverReady:
    hostname: str
    abandoned_before: float


@pytest.fixture(scope="module", autouse=True)
async def never_ready(stack: OwnershipStack, client: CertflowClient) -> NeverReady:
    """A hostname requested as the module starts and never made ready (no DNS at
    all): its PENDING_TIMEOUT_S runs while the module's other tests do."""
    hostname = f"gone.o{uuid.uuid4().hex[:8]}.test"
    abandoned_before = _given_up(stack, "abandoned")
    await client.request([hostname], tenant_id="tenant-late")
    return NeverReady(hostname, abandoned_before)


async def test_a_departed_hostname_is_served_until_it_expires_then_stops(
    stack: OwnershipStack, client: CertflowClient
) -> None:
    """A customer who left: ACTIVE, then its CNAME removed from the real zone. Its
    renewal finds it no longer routed (DNS_CNAME, RENEWING) and orders nothing while
    the edge keeps serving the certificate; once the certificate expires the row
    is EXPIRED with DEPARTED (an event says so), and DEPARTED_RETENTION_DAYS (10 s
    here) later the workflow ends: nothing re-checks it any more. One order at the
    CA in all.

    Pebble's certificates last years, so the row's expiry is brought to
    EXPIRES_IN_S from now before the renewal is asked for: the renewal re-reads the
    row (months after the last read, in production), as it would a real one.

    Shown red: with the retention check of ``_given_up`` (workflows/failures.py)
    never ending the run, the row went EXPIRED with DEPARTED but the workflow kept
    re-checking and the wait for its end timed out (TimeoutError)."""
    hostname = stack.hostname("departing")
    departed_before = _given_up(stack, "departed")
    stack.prove(client, hostname, "tenant-gone")
    await client.request([hostname], tenant_id="tenant-gone")
    first = await wait_for(client, hostname, lambda r: r.status == "ACTIVE", timeout=60)

    stack.dns.clear(hostname)  # the customer points the hostname elsewhere
    await client.pool.execute(
        "UPDATE certificates SET ssl_expires_at = now() + make_interval(secs => $2)"
        " WHERE hostname = $1",
        hostname,
        EXPIRES_IN_S,
    )
    await client.renew(hostname)
    gone = await wait_for(
        client, hostname, lambda r: r.status == "RENEWING" and r.error_code == "DNS_CNAME", timeout=60
    )
    assert gone.expires_at is not None and gone.serial == first.serial
    key = EncryptionKey(base64.b64decode(stack.env["CERTFLOW_ENCRYPTION_KEY"]))
    edge = SniCertificates(client.pool, key)
    await edge.refresh()
    assert edge.serial_for(hostname) == first.serial  # still served until it expires

    departed = await wait_for(
        client, hostname, lambda r: r.error_code == "DEPARTED", timeout=EXPIRES_IN_S + 60
    )
    assert departed.status == "EXPIRED"
    handle = client.handle(hostname)
    await asyncio.wait_for(handle.result(), timeout=DEPARTED_RETENTION_S + 60)  # the run ended
    description = await handle.describe()
    assert description.status is not None and description.status.name == "COMPLETED"
    row = await client.pool.fetchrow(
        "SELECT status, provisioning_error FROM certificates WHERE hostname = $1", hostname
    )
    assert row is not None and (row["status"], row["provisioning_error"]) == ("EXPIRED", "DEPARTED")
    assert stack.proxy.new_orders_for(hostname) == 1
    events = await client.events(hostname)
    assert any(
        e.to_status == "EXPIRED" and e.error_code == "DEPARTED" and "departed: expired" in (e.message or "")
        for e in events
    ), events
    assert _given_up(stack, "departed") == departed_before + 1


async def test_a_hostname_never_made_ready_is_abandoned(
    stack: OwnershipStack, client: CertflowClient, never_ready: NeverReady
) -> None:
    """Requested (as the module starts), never proven nor routed: after
    PENDING_TIMEOUT_DAYS (35 s here) the row is CANCELED with ABANDONED, an event says
    why, the workflow has ended, and nothing was ever ordered.

    Shown red: with the timeout check of ``_given_up`` (workflows/failures.py)
    never true, the row stayed PENDING OWNERSHIP_UNVERIFIED past the wait."""
    hostname, abandoned_before = never_ready.hostname, never_ready.abandoned_before
    report = await wait_for(
        client, hostname, lambda r: r.status == "CANCELED", timeout=PENDING_TIMEOUT_S + 60
    )
    assert report.error_code == "ABANDONED" and "abandoned" in (report.error_message or "")
    description = await client.handle(hostname).describe()
    assert description.status is not None and description.status.name == "COMPLETED"
    assert stack.proxy.new_orders_for(hostname) == 0
    events = [e.error_code for e in await client.events(hostname)]
    assert "ABANDONED" in [str(code) for code in events if code], events
    assert _given_up(stack, "abandoned") == abandoned_before + 1
