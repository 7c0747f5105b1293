"""Renewals name the certificate they replace (RFC 9773 §5), and no refusal of
``replaces`` blocks a renewal: each is scoped as Boulder scopes it (wfe2/wfe.go
validateReplacementOrder; acme_problems.replaces_refusal).

One stack for the module: Pebble behind the fault proxy, which serves an ARI
window (so the directory has ``renewalInfo`` and renewals carry ``replaces``) and
answers the new-orders that carry ``replaces`` as the case says; Pebble itself
ignores the field. Each case uses its own hostname; every new-order the proxy
received for it is kept with its payload (a hook before forwarding, and the
proxy's count of those it answered itself).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from certflow.product.client import CertflowClient
from certflow.store.db import create_pool
from devstack import servers
from devstack.faultproxy import Arriving, Endpoint, Fault, FaultProxy, start_fault_proxy
from certflow.models import CertificateStatus
from certflow.workflow_payloads import CertificateState
from certflow.connect.settings import ClientSettings
from tests.e2e.fault_fixtures import wait_for

pytestmark = pytest.mark.e2e

UTC = datetime.timezone.utc
CNAME_TARGET = "edge.replaces.test"
ERR = "urn:ietf:params:acme:error:"
REPLACES = "Could not validate ARI 'replaces' field"


@dataclass
class Orders:
    """The new-order payloads that reached the proxy, per hostname."""

    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, request: Arriving) -> None:
        try:
            payload = json.loads(request.payload or b"")
        except ValueError:
            return
        for identifier in payload.get("identifiers", []):
            with self.lock:
                self.seen.setdefault(str(identifier.get("value")), []).append(payload)

    def of(self, hostname: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.seen.get(hostname, []))


@dataclass
class ReplacesStack:
    pebble: servers.PebbleStack
    proxy: FaultProxy
    client: CertflowClient
    db: asyncpg.Pool
    orders: Orders

    def hostname(self, label: str) -> str:
        host = f"{label}.r{uuid.uuid4().hex[:8]}.test"
        self.pebble.set_cname(host, CNAME_TARGET)
        return host


Servers = tuple[servers.PebbleStack, FaultProxy, dict[str, str], Orders]


@contextlib.contextmanager
def _started(
    temporal: servers.TemporalDevServer, database_url: str, workdir: Path
) -> Iterator[Servers]:
    pebble = servers.start_pebble(workdir / "pebble", nonce_reject_percent=0)
    proxy = start_fault_proxy(pebble, workdir / "pebble")
    orders = Orders()
    remove = proxy.before_forwarding(Endpoint.NEW_ORDER, orders.record)
    try:
        now = datetime.datetime.now(UTC)
        # Inside the window from now on: every renewal is an ARI renewal.
        proxy.serve_renewal_info(now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30))
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=database_url,
            encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
            cname_target=CNAME_TARGET,
            task_queue=f"certflow-replaces-{uuid.uuid4().hex[:6]}",
            extra={
                "CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url,
                "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
                "CERTFLOW_RENEWAL_INFO_SWEEP_SECONDS": "0",
                "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
                "CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS": "2",
                "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
            },
        )
        worker = servers.start_worker(workdir / "workers", env, name="worker-replaces")
        try:
            yield pebble, proxy, env, orders
        finally:
            worker.stop()
    finally:
        remove()
        proxy.stop()
        pebble.stop()


@contextlib.asynccontextmanager
async def _connected(servers: Servers) -> AsyncIterator[ReplacesStack]:
    pebble, proxy, env, orders = servers
    client = await CertflowClient.connect(
        ClientSettings(
            database_url=env["CERTFLOW_DATABASE_URL"],
            temporal_address=env["CERTFLOW_TEMPORAL_ADDRESS"],
            task_queue=env["CERTFLOW_TASK_QUEUE"],
        )
    )
    db = await create_pool(env["CERTFLOW_DATABASE_URL"], max_size=2)
    try:
        yield ReplacesStack(pebble, proxy, client, db, orders)
    finally:
        proxy.clear()
        await db.close()
        await client.close()


@pytest.fixture(scope="module")
def _servers(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Servers]:
    with _started(temporal, new_database("certflow_replaces"), tmp_path_factory.mktemp("replaces")) as servers:
        yield servers


@pytest.fixture(scope="module")
async def stack(_servers: Servers) -> AsyncIterator[ReplacesStack]:
    async with _connected(_servers) as connected:
        yield connected


@pytest.fixture
async def own_stack(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path: Path,
) -> AsyncIterator[ReplacesStack]:
    """A stack of its own, for a case that leaves its worker refusing ``replaces``."""
    with _started(temporal, new_database("certflow_replaces_own"), tmp_path) as servers:
        async with _connected(servers) as connected:
            yield connected


async def issued(stack: ReplacesStack, hostname: str) -> CertificateState:
    await stack.client.request([hostname])
    return await wait_for(
        stack.client, hostname, lambda r: r.status is CertificateStatus.ACTIVE, 90, what="ACTIVE"
    )


async def renewed(stack: ReplacesStack, hostname: str, serial: str | None) -> CertificateState:
    await stack.client.renew(hostname)
    return await wait_for(
        stack.client,
        hostname,
        lambda r: r.status is CertificateStatus.ACTIVE and r.serial != serial,
        90,
        what="renewed",
    )


async def refused_until(stack: ReplacesStack) -> datetime.datetime | None:
    value: datetime.datetime | None = await stack.db.fetchval(
        "SELECT replaces_refused_until FROM acme_accounts"
    )
    return value


async def test_a_404_for_our_cert_id_renews_without_it_once_and_the_next_sends_it(
    stack: ReplacesStack,
) -> None:
    """A CA that wants its own certificate identifier answers every ``replaces`` with
    404 ``malformed`` "Certificate not found for certID …" (seen at a real CA other
    than Pebble). Each renewal sends ``replaces``, is refused, and goes once more
    without it: ACTIVE with a new serial; the next certificate's renewal still sends
    it (404 is about one certificate), and the account does not switch it off. Red
    before this change: the 404 named no field, so it was ACME_TEMPORARY, the same
    order with ``replaces`` every time, until the budget was spent: FAILED with the
    old certificate, renewed never."""
    hostname = stack.hostname("r404")
    first = await issued(stack, hostname)
    stack.proxy.inject_always(
        Endpoint.NEW_ORDER,
        Fault.problem(404, ERR + "malformed", "Certificate not found for certID AbC.dEf", only_with="replaces"),
    )
    try:
        received = stack.proxy.count(Endpoint.NEW_ORDER)
        second = await renewed(stack, hostname, first.serial)
        third = await renewed(stack, hostname, second.serial)
    finally:
        stack.proxy.inject_always(Endpoint.NEW_ORDER, None)
    payloads = stack.orders.of(hostname)  # forwarded ones: the refused never reach Pebble
    print(f"\n[404] new-orders forwarded: {[bool(p.get('replaces')) for p in payloads]}")
    assert [bool(p.get("replaces")) for p in payloads] == [False, False, False]
    # Each renewal: one refused with replaces (answered by the proxy), one without.
    assert stack.proxy.count(Endpoint.NEW_ORDER) - received == 4
    assert third.status is CertificateStatus.ACTIVE
    assert await refused_until(stack) is None


async def test_a_transient_500_on_replaces_is_retried_with_it(stack: ReplacesStack) -> None:
    """Boulder's 500 "Could not validate ARI 'replaces' field" (it could not read the
    certificate) once: the order is retried later *with* ``replaces``, which goes
    through; the next renewal still carries it. Red before this change: the 500
    switched ``replaces`` off for the account for good."""
    hostname = stack.hostname("r500")
    first = await issued(stack, hostname)
    stack.proxy.inject(Endpoint.NEW_ORDER, Fault.problem(500, ERR + "serverInternal", REPLACES, only_with="replaces"))
    second = await renewed(stack, hostname, first.serial)
    assert stack.proxy.pending(Endpoint.NEW_ORDER) == 0  # the 500 was answered
    await renewed(stack, hostname, second.serial)
    sent = [bool(p.get("replaces")) for p in stack.orders.of(hostname)]
    print(f"\n[500] new-orders forwarded (replaces?): {sent}")
    assert sent == [False, True, True]  # issuance, then both renewals with it
    assert await refused_until(stack) is None


async def test_a_400_malformed_on_replaces_is_asked_again_after_a_day(
    own_stack: ReplacesStack,
) -> None:
    """A CA that rejects the field itself answers our well-formed certID with 400
    ``malformed``: the renewal goes once more without it and lands, and renewals go
    without it for a day (then it is sent again). Red before this change: switched
    off for good (no such day)."""
    stack = own_stack
    hostname = stack.hostname("r400")
    first = await issued(stack, hostname)
    stack.proxy.inject(
        Endpoint.NEW_ORDER,
        Fault.problem(400, ERR + "malformed", "unknown field 'replaces'", only_with="replaces"),
    )
    try:
        second = await renewed(stack, hostname, first.serial)
        until = await refused_until(stack)
        assert until is not None
        left = until - datetime.datetime.now(UTC)
        assert datetime.timedelta(hours=23) < left <= datetime.timedelta(days=1), left
        await renewed(stack, hostname, second.serial)
        sent = [bool(p.get("replaces")) for p in stack.orders.of(hostname)]
        assert sent == [False, False, False]  # the second renewal: not asked again yet
    finally:
        stack.proxy.clear()
