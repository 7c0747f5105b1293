"""Two CAs: the one the customer's CAA allows, fallback when one cannot issue,
renewals and revocation at the CA of the certificate, External Account Binding.

One stack for the module: Knot + Unbound (real DNS: CAA read through the customer's
CNAME as a CA reads it), two Pebbles resolving through Unbound — ``ca-a`` and
``ca-b``, the second requiring External Account Binding with a MAC key — each
behind a fault proxy that records every new-order, finalize and revocation it
forwards, and one worker with ``CERTFLOW_ISSUERS`` naming both (ca-a first). Both
Pebbles validate HTTP-01 on the same port, where the worker's responder listens.
CAA identities are ``ca-a.test`` and ``ca-b.test`` (Pebble checks no CAA itself:
what is asserted is certflow's choice, and which CA then got the order).

Shown once by hand: with ``_fall_back`` in workflows/certificate.py made to return
False, the cooldown case waits on ca-a (its hostname never leaves PENDING within
the test) and the budget case ends FAILED; with the External Account Binding left
out of ``_register`` the worker cannot start at all ("externalAccountRequired");
with worker.py's ``issuer_account`` raising for a fallback CA too, the worker whose
ca-b does not answer exits 2 at start.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import subprocess
import sys
import threading
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from certflow.product.client import CertflowClient
from devstack import realdns, servers
from devstack.faultproxy import Endpoint, Fault, FaultProxy, Forwarded, start_fault_proxy
from devstack.realdns import RealDns
from certflow.models import CertificateStatus
from certflow.workflow_payloads import CertificateState
from certflow.connect.settings import ClientSettings
from tests.e2e.fault_fixtures import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EDGE = "edge.issuers.test"
MAC_KEY = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
KID = "kid-b"
POLICY = {
    "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
    "CERTFLOW_DNS_RECHECK_MAX_SECONDS": "2",
    "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
    "CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS": "2",
    "CERTFLOW_FAILED_RETRY_SECONDS": "0",
    "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
    "CERTFLOW_RENEWAL_INFO_SWEEP_SECONDS": "0",
    "CERTFLOW_ISSUER_FALLBACK_COOLDOWN_SECONDS": "600",
}


@dataclass
class CaSeen:
    """What one CA's proxy forwarded: new-orders (identifiers, payload), revocations."""

    orders: list[tuple[frozenset[str], dict[str, Any]]] = field(default_factory=list)
    revocations: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, proxy: FaultProxy) -> None:
        def on_order(request: Forwarded) -> None:
            if request.status == 201:
                payload = json.loads(request.payload or b"{}")
                with self.lock:
                    self.orders.append((request.identifiers, payload))

        def on_other(request: Forwarded) -> None:
            if urllib.parse.urlsplit(request.path).path == "/revoke-cert" and request.status == 200:
                with self.lock:
                    self.revocations += 1

        proxy.on_forwarded(Endpoint.NEW_ORDER, on_order)
        proxy.on_forwarded(Endpoint.OTHER, on_other)

    def orders_for(self, hostname: str) -> list[dict[str, Any]]:
        with self.lock:
            return [payload for names, payload in self.orders if hostname in names]


@dataclass
class TwoCas:
    dns: RealDns
    pebbles: dict[str, servers.PebbleStack]
    proxies: dict[str, FaultProxy]
    seen: dict[str, CaSeen]
    env: dict[str, str]
    database_url: str

    def customer(self, case: str, *caa: str) -> str:
        """A fresh hostname aliasing the edge; its apex's CAA names ``caa``."""
        apex = f"{case}-{uuid.uuid4().hex[:8]}.test"
        hostname = f"shop.{apex}"
        with self.dns.batch():
            self.dns.set_cname(hostname, EDGE)
            if caa:
                self.dns.set_caa(apex, [(0, "issue", issuer) for issuer in caa])
        return hostname


def issuers_setting(
    proxies: dict[str, FaultProxy], pebbles: dict[str, servers.PebbleStack], mac_key: str
) -> str:
    return json.dumps(
        [
            {
                "name": "ca-a",
                "directory_url": proxies["ca-a"].directory_url,
                "caa_domains": ["ca-a.test"],
                "ca_bundle": str(pebbles["ca-a"].ca_bundle),
            },
            {
                "name": "ca-b",
                "directory_url": proxies["ca-b"].directory_url,
                "caa_domains": ["ca-b.test"],
                "ca_bundle": str(pebbles["ca-b"].ca_bundle),
                "eab": {"kid": KID, "hmac_key": mac_key},
            },
        ]
    )


@pytest.fixture(scope="module")
def cas(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TwoCas]:
    workdir = tmp_path_factory.mktemp("issuers")
    with contextlib.ExitStack() as cleanup:
        dns = realdns.start_real_dns(workdir / "dns")
        cleanup.callback(dns.stop)
        dns.set_a(EDGE, ["127.0.0.1"])
        a = servers.start_pebble(workdir / "a", nonce_reject_percent=0, dns_server=dns.resolver)
        cleanup.callback(a.stop)
        b = servers.start_pebble(
            workdir / "b",
            nonce_reject_percent=0,
            dns_server=dns.resolver,
            http01_port=a.http01_port,  # one responder answers both CAs
            eab_keys={KID: MAC_KEY},
        )
        cleanup.callback(b.stop)
        pebbles = {"ca-a": a, "ca-b": b}
        proxies = {"ca-a": start_fault_proxy(a, workdir / "a"), "ca-b": start_fault_proxy(b, workdir / "b")}
        for proxy in proxies.values():
            cleanup.callback(proxy.stop)
        # ca-b has ARI (the proxy serves it), so its renewals can name what they replace.
        now = datetime.now(timezone.utc)
        proxies["ca-b"].serve_renewal_info(now + timedelta(days=40), now + timedelta(days=41))
        seen = {name: CaSeen() for name in proxies}
        for name, proxy in proxies.items():
            seen[name].watch(proxy)
        database_url = new_database("certflow_issuers")
        env = servers.certflow_environment(
            pebble=a,
            temporal_address=temporal.address,
            database_url=database_url,
            encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
            cname_target=EDGE,
            task_queue=f"certflow-issuers-{uuid.uuid4().hex[:8]}",
            extra={
                **POLICY,
                "CERTFLOW_DNS_RESOLVER": dns.resolver,
                "CERTFLOW_ISSUERS": issuers_setting(proxies, pebbles, MAC_KEY),
            },
        )
        del env["CERTFLOW_ACME_DIRECTORY_URL"], env["CERTFLOW_ACME_CA_BUNDLE"]
        worker = servers.start_worker(workdir / "worker", env)
        cleanup.callback(worker.stop)
        yield TwoCas(dns, pebbles, proxies, seen, env, database_url)


async def _connect(env: dict[str, str]) -> CertflowClient:
    """A client of the worker started with ``env`` (its database, Temporal, queue)."""
    return await CertflowClient.connect(
        ClientSettings(
            database_url=env["CERTFLOW_DATABASE_URL"],
            temporal_address=env["CERTFLOW_TEMPORAL_ADDRESS"],
            task_queue=env["CERTFLOW_TASK_QUEUE"],
        )
    )


@pytest.fixture(scope="module")
async def client(cas: TwoCas) -> AsyncIterator[CertflowClient]:
    connected = await _connect(cas.env)
    try:
        yield connected
    finally:
        await connected.close()


async def _active(client: CertflowClient, hostname: str, timeout: float = 90) -> CertificateState:
    return await wait_for(
        client, hostname, lambda s: s.status is CertificateStatus.ACTIVE, timeout, what="ACTIVE"
    )


async def _events(client: CertflowClient, hostname: str) -> list[str]:
    return [e.message or "" for e in await client.events(hostname)]


async def test_caa_allowing_only_b_is_issued_by_b_and_nothing_goes_to_a(
    cas: TwoCas, client: CertflowClient
) -> None:
    hostname = cas.customer("only-b", "ca-b.test")
    await client.request([hostname])
    state = await _active(client, hostname)
    assert (state.issuer, state.order_issuer) == ("ca-b", "ca-b")
    assert cas.seen["ca-a"].orders_for(hostname) == []
    assert len(cas.seen["ca-b"].orders_for(hostname)) == 1
    messages = await _events(client, hostname)
    assert "issuer ca-b: CAA does not allow ca-a" in messages
    assert any(m.startswith("issued certificate ") and m.endswith(", by ca-b") for m in messages)


async def test_caa_allowing_neither_names_what_it_would_have_to_allow(
    cas: TwoCas, client: CertflowClient
) -> None:
    hostname = cas.customer("neither", "pki.goog")
    await client.request([hostname])
    state = await wait_for(
        client, hostname, lambda s: s.error_code is not None, 60, what="an error"
    )
    assert state.status is CertificateStatus.PENDING and str(state.error_code) == "DNS_CAA"
    assert "allows only pki.goog" in (state.error_message or "")
    assert "CAA would have to allow one of ca-a.test, ca-b.test" in (state.error_message or "")
    assert cas.seen["ca-a"].orders_for(hostname) == cas.seen["ca-b"].orders_for(hostname) == []
    await client.cancel(hostname)


async def test_a_spent_budget_at_a_falls_back_to_b(cas: TwoCas, client: CertflowClient) -> None:
    """ca-a answers every new-order with a 500 (its orders never open): three
    failed attempts spend the budget there; the certificate goes on at ca-b
    instead of FAILED, and says why."""
    hostname = cas.customer("budget")
    cas.proxies["ca-a"].inject_always(Endpoint.NEW_ORDER, Fault.server_error())
    try:
        await client.request([hostname])
        state = await _active(client, hostname, timeout=180)
    finally:
        cas.proxies["ca-a"].inject_always(Endpoint.NEW_ORDER, None)
    assert state.issuer == "ca-b"
    events = await client.events(hostname)
    assert all(e.to_status != "FAILED" for e in events), [e.to_status for e in events]
    fell_back = [e.message or "" for e in events if (e.message or "").startswith("issuer ca-b:")]
    assert len(fell_back) == 1, fell_back
    assert fell_back[0].startswith("issuer ca-b: fell back from ca-a, ACME_TEMPORARY after 3 attempts")


async def test_a_long_cooldown_at_a_sends_new_orders_to_b_and_renewals_stay_on_b(
    cas: TwoCas, client: CertflowClient
) -> None:
    """One 429 with Retry-After 2 h (past the 10 min setting) from ca-a: an
    account-wide cooldown there. The hostname that met it and the next one go to
    ca-b, the next one without a request to ca-a at all. Their renewal, with the
    cooldown over, stays on ca-b (and names the certificate it replaces); their
    revocation goes to ca-b."""
    first, second = cas.customer("cooldown"), cas.customer("cooldown")
    cas.proxies["ca-a"].inject(Endpoint.NEW_ORDER, Fault.rate_limited("7200"))
    try:
        await client.request([first])
        state = await _active(client, first)
        assert state.issuer == "ca-b"
        assert cas.seen["ca-a"].orders_for(first) == []  # the 429: no order opened
        reasons = [m for m in await _events(client, first) if m.startswith("issuer ca-b:")]
        assert len(reasons) == 1 and reasons[0].startswith(
            "issuer ca-b: fell back from ca-a, rate-limited until "
        ), reasons
        held = [c for c in await client.cooldowns() if c.directory_url == cas.proxies["ca-a"].directory_url]
        assert held, "the 429 set no cooldown at ca-a"

        await client.request([second])
        assert (await _active(client, second)).issuer == "ca-b"
        assert cas.seen["ca-a"].orders_for(second) == []
    finally:
        await client.clear_cooldowns()

    await client.renew(first)
    state = await wait_for(
        client,
        first,
        lambda s: s.status is CertificateStatus.ACTIVE and len(cas.seen["ca-b"].orders_for(first)) == 2,
        90,
        what="the renewal issued",
    )
    assert state.issuer == "ca-b"
    assert cas.seen["ca-a"].orders_for(first) == []
    renewal_order = cas.seen["ca-b"].orders_for(first)[-1]
    assert renewal_order.get("replaces"), renewal_order  # RFC 9773: only at the same CA

    revocations = {name: seen.revocations for name, seen in cas.seen.items()}
    deleted = await client.delete(first, revoke=True)
    assert deleted.phase == "deleted", deleted
    assert cas.seen["ca-b"].revocations == revocations["ca-b"] + 1
    assert cas.seen["ca-a"].revocations == revocations["ca-a"]
    await client.cancel(second)


async def test_a_fallback_ca_down_at_start_does_not_stop_the_worker(
    cas: TwoCas, tmp_path: Path
) -> None:
    """ca-b's directory answers nothing (a closed port) when a worker starts: it
    starts anyway, without ca-b's account; a hostname CAA lets both CAs serve is
    issued by ca-a, one only ca-b may serve waits on ACME_TEMPORARY naming ca-b.
    (Before: the worker refused to start, as for the first CA.)"""
    issuers = json.loads(issuers_setting(cas.proxies, cas.pebbles, MAC_KEY))
    issuers[1]["directory_url"] = f"https://127.0.0.1:{servers.free_port()}/dir"
    env = {
        **cas.env,
        "CERTFLOW_ISSUERS": json.dumps(issuers),
        "CERTFLOW_TASK_QUEUE": f"certflow-issuers-down-{uuid.uuid4().hex[:8]}",
        "CERTFLOW_HTTP01_LISTEN": f"127.0.0.1:{servers.free_port()}",
    }
    worker = servers.start_worker(tmp_path / "worker", env, name="down-at-start", timeout=120)
    client = await _connect(env)
    try:
        both, only_b = cas.customer("down-both"), cas.customer("down-only-b", "ca-b.test")
        await client.request([both, only_b])
        assert (await _active(client, both)).issuer == "ca-a"
        waiting = await wait_for(
            client, only_b, lambda s: s.error_code is not None, 90, what="an error"
        )
        assert str(waiting.error_code) == "ACME_TEMPORARY", waiting
        assert (waiting.error_message or "").startswith("no ACME account at ca-b yet: "), waiting
        await client.cancel(only_b)
    finally:
        await client.close()
        worker.stop()
    log = (tmp_path / "worker" / "down-at-start.log").read_text()
    assert "starting without the ACME account of ca-b" in log


@pytest.mark.parametrize(
    ("binding", "expected"),
    [
        ("wrong", "external account binding JWS verification error"),
        ("missing", "must include a value for the 'externalAccountBinding' field"),
    ],
)
async def test_a_wrong_or_missing_eab_stops_the_worker_naming_the_issuer(
    cas: TwoCas, new_database: Callable[..., str], binding: str, expected: str
) -> None:
    """On a fresh database: the worker exits 2 with one line naming ca-b (and its
    binding), and stores no account for ca-b."""
    database_url = new_database("certflow_issuers_eab")
    wrong = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    issuers = json.loads(issuers_setting(cas.proxies, cas.pebbles, wrong))
    if binding == "missing":
        del issuers[1]["eab"]
    env = {
        **cas.env,
        "CERTFLOW_DATABASE_URL": database_url,
        "CERTFLOW_ISSUERS": json.dumps(issuers),
        "CERTFLOW_HTTP01_LISTEN": f"127.0.0.1:{servers.free_port()}",
    }
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env={**_plain_environment(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    with_binding = " with its External Account Binding" if binding == "wrong" else ""
    assert line.startswith(
        "certflow: configuration error: CERTFLOW_ISSUERS (ca-b): cannot register the ACME"
        f" account{with_binding} at {cas.proxies['ca-b'].directory_url}: "
    ), line
    assert expected in line, line
    assert wrong not in result.stderr and MAC_KEY not in result.stderr
    conn = await asyncpg.connect(database_url)
    try:
        stored = [r["directory_url"] for r in await conn.fetch("SELECT directory_url FROM acme_accounts")]
    finally:
        await conn.close()
    assert stored == [cas.proxies["ca-a"].directory_url]  # ca-a's only


def _plain_environment() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
