"""Issue 39, item 3: an order whose authorization the CA reused, already valid by
http-01, issues under ``--method dns-01`` (no ACME_REJECTED).

The stack is test_dns_validation.py's (Knot for ``test.`` and the two Knot servers
of our ``acme.test.`` challenge zone, Unbound, Pebble validating through it, the
fault proxy in front of Pebble counting what the CA was asked, a worker with the
dns-01 zone), started for this module alone because its Pebble runs with
``PEBBLE_AUTHZREUSE=100``: a new order of the same account and name gets the valid
authorization back (that module's Pebble runs with 0, and its tests count one
order and one accept per name).

Shown red: with the valid branch of ``choose_challenge`` (certflow/acme/new_order.py)
disabled (``if False:`` in place of ``if authz.status == messages.STATUS_VALID and
authz.challenges:``), the renewal's order got the reused authorization listing
only its http-01 challenge, and the row went FAILED with ACME_REJECTED ("the CA
default offers no dns-01 challenge for … (it offers http-01)"), no new serial;
restored, the test passes (about 8 s)."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import threading
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest

from certflow.product.client import CertflowClient
from certflow.models import RequestedMethod
from devstack import servers
from devstack.dns01zone import start_dns01_servers
from devstack.faultproxy import Endpoint, FaultProxy, Forwarded, start_fault_proxy
from tests.e2e.fault_fixtures import SHORT_POLICY, HttpAnswerer, client_of, wait_for
from tests.e2e.test_dns_validation import EDGE, NOWHERE, CaView, DnsValidationStack

pytestmark = pytest.mark.e2e


@dataclass
class OrdersView:
    """Per hostname, each new order as the CA created it: (its status, the paths of
    its authorizations)."""

    created: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, proxy: FaultProxy) -> None:
        proxy.on_forwarded(Endpoint.NEW_ORDER, self._on_new_order)

    def _on_new_order(self, request: Forwarded) -> None:
        if request.status != 201:
            return
        order = json.loads(request.response_body)
        authorizations = [urllib.parse.urlsplit(url).path for url in order.get("authorizations", [])]
        with self.lock:
            for hostname in request.identifiers:
                self.created.setdefault(hostname, []).append((str(order.get("status")), authorizations))

    def of(self, hostname: str) -> list[tuple[str, list[str]]]:
        with self.lock:
            return list(self.created.get(hostname, []))


@dataclass
class ReuseStack:
    stack: DnsValidationStack
    orders: OrdersView


@pytest.fixture(scope="module")
def reuse(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ReuseStack]:
    workdir = tmp_path_factory.mktemp("reused-authorization")
    with contextlib.ExitStack() as cleanup:
        started = start_dns01_servers(workdir, cleanup, EDGE, authz_reuse_percent=100)
        old_provider = HttpAnswerer(NOWHERE, started.pebble.http01_port, lambda path: (404, {}))
        cleanup.callback(old_provider.stop)
        proxy = start_fault_proxy(started.pebble, workdir / "pebble")
        cleanup.callback(proxy.stop)
        ca, orders = CaView(), OrdersView()
        ca.install(proxy)
        orders.install(proxy)
        database_url = new_database("certflow_reused_authorization")
        env = servers.certflow_environment(
            pebble=started.pebble,
            temporal_address=temporal.address,
            database_url=database_url,
            encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
            cname_target=EDGE,
            task_queue=f"certflow-reuse-{uuid.uuid4().hex[:8]}",
            extra={
                **SHORT_POLICY,
                **started.environment(),
                "CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url,
                "CERTFLOW_METRICS_LISTEN": f"127.0.0.1:{servers.free_port()}",
            },
        )
        worker = servers.start_worker(workdir / "workers", env)
        stack = DnsValidationStack(
            started.zone, started.dns, started.pebble, proxy, ca, temporal, database_url, env,
            workdir, worker, old_provider,
        )
        try:
            yield ReuseStack(stack, orders)
        finally:
            worker.stop()


@pytest.fixture(scope="module")
async def client(reuse: ReuseStack) -> AsyncIterator[CertflowClient]:
    async with client_of(reuse.stack.env) as opened:
        yield opened


async def test_a_reused_http01_authorization_issues_under_dns01(
    reuse: ReuseStack, client: CertflowClient
) -> None:
    """A hostname routed to the edge issues over http-01; the customer then asks for
    ``--method dns-01`` (the delegation in place, so the pre-check says dns-01 is
    ready) and renews while that authorization is still valid. The renewal's order
    comes back ready with the same authorization (the CA reused it), certflow POSTs
    no challenge for it and just finalizes: a new serial, ACTIVE, and no
    ACME_REJECTED among the row's events."""
    stack = reuse.stack
    hostname = f"reused.c{uuid.uuid4().hex[:8]}.test"
    stack.dns.set_cname(hostname, EDGE)
    await client.request([hostname], method=RequestedMethod.HTTP_01)
    first = await wait_for(client, hostname, lambda r: r.status == "ACTIVE", timeout=90)
    assert stack.ca.accepted_types(hostname) == ["http-01"], stack.ca.accepted_types(hostname)

    stack.delegate(hostname)
    await client.request([hostname], method=RequestedMethod.DNS_01)  # keeps the row, sets its method
    row = await client.pool.fetchrow("SELECT * FROM certificates WHERE hostname = $1", hostname)
    assert row is not None and row["requested_method"] == "dns-01", row
    await client.renew(hostname)
    renewed = await wait_for(
        client,
        hostname,
        lambda r: (r.status == "ACTIVE" and r.serial != first.serial) or r.error_code is not None,
        timeout=90,
        what="the renewal's outcome",
    )
    events = await client.events(hostname)
    codes = [event.error_code for event in events if event.error_code is not None]
    assert "ACME_REJECTED" not in codes and renewed.error_code is None, (renewed, events)
    assert renewed.status == "ACTIVE" and renewed.serial != first.serial, (first, renewed)

    orders = reuse.orders.of(hostname)
    assert len(orders) == 2 == stack.ca.orders(hostname), orders
    (_, first_authz), (second_status, second_authz) = orders
    assert second_authz == first_authz and second_status == "ready", orders  # reused, valid
    # No challenge POSTed for the second order: the only accept is the first order's.
    assert stack.ca.accepted_types(hostname) == ["http-01"], stack.ca.accepted_types(hostname)
    row = await client.pool.fetchrow("SELECT * FROM certificates WHERE hostname = $1", hostname)
    assert row is not None
    print(
        f"\n[reused authz] {hostname}: {first.serial} -> {renewed.serial} under dns-01,"
        f" validation_method {row['validation_method']}, events {[(e.to_status, e.error_code) for e in events]}"
    )
