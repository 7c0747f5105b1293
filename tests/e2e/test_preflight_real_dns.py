"""The pre-checks (docs/lifecycle.md, "Before the CA is asked") against real DNS: CAA as Let's Encrypt reads it and
the HTTP-01 self-check, each asserted by what the CA saw.

One stack for the module: Knot (authoritative for ``test.``) + Unbound (recursive),
Pebble resolving through Unbound, the fault proxy in front of Pebble (so every
new-order, challenge accept, authorization and order the CA answered is counted
and inspected), its own database, and three workers on the session's Temporal dev
server, each on its own task queue and CNAME target:

- ``main`` (CNAME target ``edge.saas.test``, A 127.0.0.1): it owns Pebble's
  HTTP-01 port on 127.0.0.1, so its responder answers every challenge the CA
  fetches (challenges live in the shared database). Short DNS backoff.
- ``routed`` (CNAME target ``route.saas.test``, responder on 127.0.0.2): for the
  self-check cases, whose A record the test points at nothing (127.0.0.9), at a
  redirecting server (127.0.0.10), or back at 127.0.0.1. Its DNS backoff is 10
  minutes, so only ``retry`` can explain a certificate moving on within the test.
- ``unchecked`` (CNAME target ``dead.saas.test`` = 127.0.0.9, responder on
  127.0.0.3): ``CERTFLOW_HTTP01_SELF_CHECK=false``, the control that shows what
  the self-check buys: the same unroutable hostname costs a failed validation at
  the CA (ACME_INVALID_ORDER).

The edge's CAA set applies to every customer aliasing it: a CAA query for a
customer hostname follows its CNAME chain to the end (the edge) and the CAA found
there is the set that decides — whatever intermediate aliases a chain has. So the
edge-CAA cases (1, 2, 4, 5, and the CLI's) run one after another in file order,
each setting ``edge.saas.test``'s CAA, asserting, cancelling whatever it left
waiting (so a later edge change cannot move it on), and clearing the edge's CAA
again. The customer-apex cases use their own names (``c3-<id>.test``), so they
need nothing restored.

Shown once by hand (not kept as tests, which would need product code changed):

- With ``find_caa_set`` in certflow/dns/caa.py (since in caa_climb.py) made to ignore the CNAME
  chain (its lookup's answer passed on without the chain, so the edge's CAA
  records look owned by a name off the chain and are dropped), case 1 goes red
  (both variants): the walk finds no CAA on ``shop.c1-….test``, ``c1-….test``
  or ``test``, the hostname is permitted and ordered, and
  ``test_edge_caa_forbids`` fails with "the CA got an order" (one new-order for
  the hostname at the proxy; left alone, it is issued). Reverted by hand.
- Without the self-check, case 6 is charged by the CA: that is kept as a real
  test (``test_without_the_self_check_the_ca_charges_a_failed_validation``) on
  the ``unchecked`` worker.

Every wait is on a condition (the row's status, error code, phase; a visible
workflow); figures are printed (run with -s).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cryptography import x509

from certflow.product.client import CertflowClient
from certflow.contract import DOMAIN_CHECK_WORKFLOW
from devstack import realdns, servers
from devstack.faultproxy import Arriving, Endpoint, FaultProxy, Forwarded, start_fault_proxy
from devstack.realdns import RealDns
from tests.history_events import activities_run
from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, Phase
from certflow.workflow_payloads import CertificateState
from certflow.connect.settings import ClientSettings
from tests.e2e.fault_fixtures import HttpAnswerer, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

EDGE = "edge.saas.test"  # the main worker's CNAME target
ROUTE = "route.saas.test"  # the routed worker's: its A record is what case 6 breaks
DEAD = "dead.saas.test"  # the unchecked worker's: A 127.0.0.9, where nothing listens
NOWHERE = "127.0.0.9"
REDIRECTOR = "127.0.0.10"
NOT_FOUND = "127.0.0.11"
RESERVED = "127.0.0.12"  # answers the challenge, but the routed worker may not connect to it
ROUTED_HOSTS = f"127.0.0.1/32,{NOWHERE}/32,{REDIRECTOR}/32,{NOT_FOUND}/32,::1/128"
ISSUER = "letsencrypt.org"  # CERTFLOW_CAA_ISSUER_DOMAIN's default
ARROW = " → "
LONG_BACKOFF_S = 600

SHORT_POLICY = {
    "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
    "CERTFLOW_DNS_RECHECK_MAX_SECONDS": "2",
    "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
    "CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS": "2",
    "CERTFLOW_FAILED_RETRY_SECONDS": "0",
    "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
}


# ------------------------------------------------------------------------ the CA's view


@dataclass(frozen=True)
class Seen:
    """One request the proxy forwarded to Pebble, as the hooks recorded it."""

    endpoint: Endpoint
    method: str
    path: str
    payload: Any
    """The decoded JWS payload as JSON (``None`` for POST-as-GET or a GET)."""
    status: int
    answer: Any
    """Pebble's JSON answer (``None`` when not JSON)."""


def _json(data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


class CaLog:
    """Every challenge, authorization and order request the CA answered."""

    def __init__(self, proxy: FaultProxy) -> None:
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._removers = [
            proxy.on_forwarded(endpoint, self._record)
            for endpoint in (Endpoint.CHALLENGE, Endpoint.AUTHZ, Endpoint.ORDER, Endpoint.FINALIZE)
        ]

    def _record(self, request: Forwarded) -> None:
        seen = Seen(
            request.endpoint,
            request.method,
            urllib.parse.urlsplit(request.path).path,
            _json(request.payload),
            request.status,
            _json(request.response_body),
        )
        with self._lock:
            self._seen.append(seen)

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def challenge_paths(self, hostname: str) -> set[str]:
        """The challenge URLs (paths) of every authorization the CA showed for hostname."""
        paths: set[str] = set()
        for s in self.seen():
            if s.endpoint is Endpoint.AUTHZ and isinstance(s.answer, dict):
                if s.answer.get("identifier", {}).get("value") == hostname:
                    for challenge in s.answer.get("challenges", []):
                        paths.add(urllib.parse.urlsplit(str(challenge.get("url"))).path)
        return paths

    def accepts(self, hostname: str, challenge_path: str | None = None) -> int:
        """POSTs of ``{}`` to hostname's challenges: each asks the CA to validate."""
        paths = {challenge_path} if challenge_path else self.challenge_paths(hostname)
        return sum(
            1
            for s in self.seen()
            if s.endpoint is Endpoint.CHALLENGE
            and s.method == "POST"
            and s.payload == {}
            and s.path in paths
        )

    def csrs(self, hostname: str) -> list[x509.CertificateSigningRequest]:
        """The CSRs finalize requests sent for hostname (by their SAN)."""
        found = []
        for s in self.seen():
            if s.endpoint is Endpoint.FINALIZE and isinstance(s.payload, dict) and "csr" in s.payload:
                encoded = str(s.payload["csr"])
                der = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
                csr = x509.load_der_x509_csr(der)
                san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                if hostname in san.get_values_for_type(x509.DNSName):
                    found.append(csr)
        return found

    def invalid(self, hostname: str) -> list[str]:
        """Authorizations and orders for hostname the CA answered as invalid (a failed
        validation), as ``endpoint path``."""
        found = []
        for s in self.seen():
            if not isinstance(s.answer, dict) or s.answer.get("status") != "invalid":
                continue
            if s.endpoint is Endpoint.AUTHZ:
                names = [s.answer.get("identifier", {}).get("value")]
            elif s.endpoint is Endpoint.ORDER:
                names = [i.get("value") for i in s.answer.get("identifiers", [])]
            else:
                names = []
            if hostname in names:
                found.append(f"{s.endpoint} {s.path}")
        return found


# ----------------------------------------------------------------------------- the stack


@dataclass
class DnsStack:
    dns: RealDns
    pebble: servers.PebbleStack
    proxy: FaultProxy
    ca: CaLog
    temporal: servers.TemporalDevServer
    database_url: str
    envs: dict[str, dict[str, str]]
    """Worker name → its environment: ``main``, ``routed``, ``unchecked``."""
    workers: list[servers.WorkerProcess] = field(default_factory=list)

    @property
    def http01_port(self) -> int:
        return self.pebble.http01_port

    def task_queue(self, worker: str = "main") -> str:
        return self.envs[worker]["CERTFLOW_TASK_QUEUE"]

    def client_env(self, worker: str = "main") -> dict[str, str]:
        keep = ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE")
        return {k: self.envs[worker][k] for k in keep}

    def customer(self, case: str, target: str = EDGE, label: str = "shop") -> tuple[str, str]:
        """A fresh customer (hostname, apex) whose hostname is a CNAME to ``target``."""
        apex = f"{case}-{uuid.uuid4().hex[:8]}.test"
        hostname = f"{label}.{apex}"
        self.dns.set_cname(hostname, target)
        return hostname, apex

    @contextlib.contextmanager
    def edge_caa(self, *records: tuple[int, str, str]) -> Iterator[None]:
        """The edge's CAA set for the block, cleared after it (every customer reads it)."""
        self.dns.set_caa(EDGE, list(records))
        try:
            yield
        finally:
            self.dns.set_caa(EDGE, [])


@pytest.fixture(scope="module")
def stack(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DnsStack]:
    workdir = tmp_path_factory.mktemp("preflight-realdns")
    with contextlib.ExitStack() as cleanup:
        dns = realdns.start_real_dns(workdir / "dns", failures=True)
        cleanup.callback(dns.stop)
        with dns.batch():
            dns.set_a(EDGE, ["127.0.0.1"])
            dns.set_a(ROUTE, ["127.0.0.1"])
            dns.set_a(DEAD, [NOWHERE])
        # No authorization reuse: an authorization the proxy failed (case 10) must not
        # come back, valid, in the next order (Boulder never reuses an invalid one).
        pebble = servers.start_pebble(
            workdir / "pebble", nonce_reject_percent=0, dns_server=dns.resolver, authz_reuse_percent=0
        )
        cleanup.callback(pebble.stop)
        proxy = start_fault_proxy(pebble, workdir / "pebble")
        cleanup.callback(proxy.stop)
        ca = CaLog(proxy)
        database_url = new_database("certflow_preflight_dns")
        key = base64.b64encode(secrets.token_bytes(32)).decode()
        port = pebble.http01_port

        def environment(name: str, cname_target: str, listen: str, **extra: str) -> dict[str, str]:
            return servers.certflow_environment(
                pebble=pebble,
                temporal_address=temporal.address,
                database_url=database_url,
                encryption_key=key,  # one account, shared by the workers
                cname_target=cname_target,
                task_queue=f"certflow-preflight-{name}-{uuid.uuid4().hex[:8]}",
                extra={
                    **SHORT_POLICY,
                    "CERTFLOW_DNS_RESOLVER": dns.resolver,
                    "CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url,
                    "CERTFLOW_HTTP01_LISTEN": f"{listen}:{port}",
                    **extra,
                },
            )

        envs = {
            "main": environment("main", EDGE, "127.0.0.1"),
            "routed": environment(
                "routed",
                ROUTE,
                "127.0.0.2",
                CERTFLOW_DNS_RECHECK_INITIAL_SECONDS=str(LONG_BACKOFF_S),
                CERTFLOW_DNS_RECHECK_MAX_SECONDS=str(LONG_BACKOFF_S * 6),
                # Only the loopback "hosts" the cases use: any other is reserved, as
                # every loopback address is to a real CA.
                CERTFLOW_HTTP01_ALLOW_RESERVED=ROUTED_HOSTS,
                CERTFLOW_METRICS_LISTEN=f"127.0.0.1:{servers.free_port()}",
            ),
            "unchecked": environment(
                "unchecked",
                DEAD,
                "127.0.0.3",
                CERTFLOW_HTTP01_SELF_CHECK="false",
                CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS=str(LONG_BACKOFF_S),
                CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS=str(LONG_BACKOFF_S * 6),
            ),
        }
        result = DnsStack(dns, pebble, proxy, ca, temporal, database_url, envs)
        for name, env in envs.items():  # main first: it registers the ACME account
            worker = servers.start_worker(workdir / "workers", env, name=name)
            cleanup.callback(worker.stop)
            result.workers.append(worker)
        yield result


@pytest.fixture(scope="module")
async def clients(stack: DnsStack) -> AsyncIterator[dict[str, CertflowClient]]:
    opened: dict[str, CertflowClient] = {}
    try:
        for name in stack.envs:
            opened[name] = await CertflowClient.connect(
                ClientSettings(
                    database_url=stack.database_url,
                    temporal_address=stack.temporal.address,
                    task_queue=stack.task_queue(name),
                )
            )
        yield opened
    finally:
        for c in opened.values():
            await c.close()


@pytest.fixture(scope="module")
async def db(stack: DnsStack) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


# ------------------------------------------------------------------------------ helpers


VERDICTS = (ErrorCode.DNS_CNAME, ErrorCode.DNS_CAA, ErrorCode.HTTP01_UNREACHABLE)


def has_code(code: ErrorCode) -> Callable[[CertificateState], bool]:
    return lambda r: r.error_code is code


def is_active(r: CertificateState) -> bool:
    return r.status is CertificateStatus.ACTIVE


def show(case: str, report: CertificateState, stack: DnsStack) -> None:
    print(
        f"\n[{case}] {report.hostname}: {report.status} {report.error_code or ''} "
        f"retry_count={report.retry_count} new-orders={stack.proxy.new_orders_for(report.hostname)} "
        f"accepts={stack.ca.accepts(report.hostname)} msg={report.error_message!r}"
    )


async def refused_at_dns(
    stack: DnsStack, client: CertflowClient, hostname: str, message: str, case: str
) -> None:
    """Request hostname: DNS_CAA with exactly ``message``, PENDING, nothing ordered;
    then cancel it, so a later change of the edge cannot move it on."""
    await client.request([hostname])
    try:
        # Ends early when the CA gets an order: a wrong verdict shows at once.
        report = await wait_for(
            client,
            hostname,
            lambda r: r.error_code is ErrorCode.DNS_CAA
            or r.status is CertificateStatus.ACTIVE
            or stack.proxy.new_orders_for(hostname) > 0,
            what="DNS_CAA",
        )
        show(case, report, stack)
        assert stack.proxy.new_orders_for(hostname) == 0, f"the CA got an order: {report}"
        assert report.error_code is ErrorCode.DNS_CAA
        assert report.status is CertificateStatus.PENDING
        assert report.error_message == message
        assert report.retry_count == 0
        assert stack.proxy.new_orders_for(hostname) == 0
        events = await client.events(hostname)
        assert any(e.error_code == ErrorCode.DNS_CAA for e in events), events
    finally:
        await client.cancel(hostname)
    assert stack.proxy.new_orders_for(hostname) == 0


async def issued(stack: DnsStack, client: CertflowClient, hostname: str, case: str) -> CertificateState:
    await client.request([hostname])
    # Ends early on a verdict that only a DNS edit would change.
    report = await wait_for(
        client, hostname, lambda r: is_active(r) or r.error_code in VERDICTS, what="ACTIVE"
    )
    show(case, report, stack)
    assert is_active(report), report
    assert stack.proxy.new_orders_for(hostname) == 1
    assert stack.ca.invalid(hostname) == []
    return report


def via(hostname: str, *chain: str) -> str:
    return f"CAA at {chain[-1]} (via {ARROW.join([hostname, *chain])})"


# ------------------------------------------------------------------- CAA (cases 1 to 5)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("digicert.com", "allows only digicert.com"),
        (";", 'forbids all certificate issuance (issue ";")'),
        # va/caa.go caaDomainMatches is ==: shown red when issuer domains were
        # lower-cased before comparing (the CA got an order).
        (
            "LetsEncrypt.org",
            "allows only LetsEncrypt.org (issuer domains compare exactly, as at the CA:"
            " LetsEncrypt.org is not letsencrypt.org)",
        ),
    ],
    ids=["digicert", "no-ca", "issuer-in-another-case"],
)
async def test_edge_caa_forbids(
    stack: DnsStack, clients: dict[str, CertflowClient], value: str, why: str
) -> None:
    """Case 1: the customer's hostname owns no CAA (it is a CNAME); the edge's set,
    at the end of its alias chain, is the one the CA reads first, and it refuses:
    DNS_CAA naming the edge and the chain, and the CA never sees an order."""
    hostname, _ = stack.customer("c1")
    with stack.edge_caa((0, "issue", value)):
        await refused_at_dns(
            stack, clients["main"], hostname, f"{via(hostname, EDGE)} {why}", "case 1"
        )


async def test_edge_caa_decides_over_the_customer_apex(
    stack: DnsStack, clients: dict[str, CertflowClient]
) -> None:
    """Case 2: the edge allows our issuer, the customer's apex allows only
    sectigo.com: the first non-empty set on the walk (the edge's, reached through
    the hostname's alias) decides, so the certificate is issued."""
    hostname, apex = stack.customer("c2")
    stack.dns.set_caa(apex, [(0, "issue", "sectigo.com")])
    with stack.edge_caa((0, "issue", ISSUER)):
        await issued(stack, clients["main"], hostname, "case 2")


async def test_customer_apex_caa_forbids_when_the_edge_has_none(
    stack: DnsStack, clients: dict[str, CertflowClient]
) -> None:
    """Case 3: no CAA at the edge (NODATA at the alias target: an empty set), so the
    walk climbs the hostname's own parents: the apex allows only sectigo.com."""
    hostname, apex = stack.customer("c3")
    stack.dns.set_caa(apex, [(0, "issue", "sectigo.com")])
    message = f"CAA at {apex} allows only sectigo.com (applies to {hostname})"
    await refused_at_dns(stack, clients["main"], hostname, message, "case 3")


async def test_validationmethods(stack: DnsStack, clients: dict[str, CertflowClient]) -> None:
    """Case 4: RFC 8657 validationmethods at the edge: dns-01 only refuses us (we
    validate with http-01), http-01 lets us issue."""
    refused, _ = stack.customer("c4")
    with stack.edge_caa((0, "issue", f"{ISSUER}; validationmethods=dns-01")):
        message = (
            f"{via(refused, EDGE)} allows {ISSUER} only with validationmethods=dns-01 "
            "(we validate with http-01)"
        )
        await refused_at_dns(stack, clients["main"], refused, message, "case 4 dns-01")
    allowed, _ = stack.customer("c4")
    with stack.edge_caa((0, "issue", f"{ISSUER}; validationmethods=http-01")):
        await issued(stack, clients["main"], allowed, "case 4 http-01")


async def test_accounturi(
    stack: DnsStack, clients: dict[str, CertflowClient], db: asyncpg.Pool
) -> None:
    """Case 5: RFC 8657 accounturi at the edge: our registered account's URL (as the
    stack's database holds it) lets us issue; another account's refuses us."""
    ours: str = await db.fetchval(
        "SELECT account_url FROM acme_accounts WHERE directory_url = $1",
        stack.envs["main"]["CERTFLOW_ACME_DIRECTORY_URL"],
    )
    assert ours and ours.startswith("https://"), ours
    other = ours.rstrip("/").rsplit("/", 1)[0] + "/999999"
    assert other != ours
    print(f"\n[case 5] our account {ours}; the other {other}")

    allowed, _ = stack.customer("c5")
    with stack.edge_caa((0, "issue", f"{ISSUER}; accounturi={ours}")):
        await issued(stack, clients["main"], allowed, "case 5 ours")
    refused, _ = stack.customer("c5")
    with stack.edge_caa((0, "issue", f"{ISSUER}; accounturi={other}")):
        message = f"{via(refused, EDGE)} allows {ISSUER} only for account {other} (ours is {ours})"
        await refused_at_dns(stack, clients["main"], refused, message, "case 5 other")


# --------------------------------------------------------------- the self-check (case 6)


async def open_challenge(db: asyncpg.Pool, hostname: str) -> tuple[str, str]:
    """The row's kept order and challenge URL (path)."""
    row = await db.fetchrow(
        "SELECT http_order_url, http_challenge_url FROM certificates WHERE hostname = $1", hostname
    )
    assert row is not None and row["http_order_url"] and row["http_challenge_url"], row
    return str(row["http_order_url"]), urllib.parse.urlsplit(row["http_challenge_url"]).path


async def challenge_token(db: asyncpg.Pool, hostname: str) -> str:
    token = await db.fetchval(
        "SELECT http_challenge_token FROM certificates WHERE hostname = $1", hostname
    )
    assert token, hostname
    return str(token)


async def test_unroutable_edge_is_caught_before_the_ca_then_retry_issues(
    stack: DnsStack, clients: dict[str, CertflowClient], db: asyncpg.Pool
) -> None:
    """Case 6a: the hostname's chain ends at a name whose A record is 127.0.0.9,
    where nothing listens. The self-check fetches the challenge as the CA would and
    is refused: HTTP01_UNREACHABLE, PENDING, budget untouched, the order created
    once and kept, and no accept ever sent (no failed authorization at the CA).
    Routed back to 127.0.0.1, ``retry`` — not the 10-minute backoff — makes the
    same order valid: ACTIVE, still one order."""
    client = clients["routed"]
    stack.dns.set_a(ROUTE, [NOWHERE])
    hostname, _ = stack.customer("c6a", target=ROUTE)
    await client.request([hostname])
    try:
        waiting = await wait_for(
            client,
            hostname,
            lambda r: r.error_code is ErrorCode.HTTP01_UNREACHABLE
            and r.phase == Phase.WAITING_FOR_HTTP01,
            what="HTTP01_UNREACHABLE and waiting",
        )
        show("case 6a", waiting, stack)
        assert waiting.status is CertificateStatus.PENDING and waiting.retry_count == 0
        order_url, challenge = await open_challenge(db, hostname)
        token = await challenge_token(db, hostname)
        # The CA's own words for it (va/va.go detailedError).
        assert waiting.error_message == (
            f"{NOWHERE}: Fetching http://{hostname}/.well-known/acme-challenge/{token}:"
            " Connection refused"
        )
        assert stack.proxy.new_orders_for(hostname) == 1
        assert challenge in stack.ca.challenge_paths(hostname)
        assert stack.ca.accepts(hostname, challenge) == 0, "the CA was asked to validate"
        assert stack.ca.invalid(hostname) == []
        assert waiting.next_attempt_at is not None
        backoff_left = (waiting.next_attempt_at - datetime.now(timezone.utc)).total_seconds()
        assert backoff_left > LONG_BACKOFF_S - 60, waiting.next_attempt_at

        stack.dns.set_a(ROUTE, ["127.0.0.1"])
        retried_at = time.monotonic()
        await client.retry(hostname)
        active = await wait_for(client, hostname, is_active, 60, what="ACTIVE after retry")
        took = time.monotonic() - retried_at
    finally:
        stack.dns.set_a(ROUTE, ["127.0.0.1"])
    show("case 6a", active, stack)
    print(
        f"[case 6a] ACTIVE {took:.2f} s after retry (the backoff had {backoff_left:.0f} s left); "
        f"accepts at the CA: {stack.ca.accepts(hostname, challenge)}; order {order_url}"
    )
    assert took < backoff_left  # only the retry explains it
    assert stack.proxy.new_orders_for(hostname) == 1, "the kept order was replaced"
    assert stack.ca.accepts(hostname, challenge) >= 1
    assert stack.ca.invalid(hostname) == []


async def test_redirect_to_a_404_is_caught_before_the_ca(
    stack: DnsStack, clients: dict[str, CertflowClient], db: asyncpg.Pool
) -> None:
    """Case 6b: the hostname's address answers 302 to http://127.0.0.11/…, which
    answers 404: HTTP01_UNREACHABLE in the CA's words, nothing accepted. (The
    target is an IP literal: a name under ``.test`` is no IANA TLD, which the CA
    refuses before fetching anything — case 9c's business.)"""
    client = clients["routed"]
    port = stack.http01_port
    hostname, apex = stack.customer("c6b", target=ROUTE)
    stack.dns.set_a(ROUTE, [REDIRECTOR])
    redirector = HttpAnswerer(REDIRECTOR, port, lambda path: (302, {"Location": f"http://{NOT_FOUND}{path}"}))
    missing = HttpAnswerer(NOT_FOUND, port, lambda path: (404, {}))
    try:
        await client.request([hostname])
        try:
            waiting = await wait_for(
                client, hostname, has_code(ErrorCode.HTTP01_UNREACHABLE), what="HTTP01_UNREACHABLE"
            )
            show("case 6b", waiting, stack)
            _, challenge = await open_challenge(db, hostname)
            path = f"/.well-known/acme-challenge/{await challenge_token(db, hostname)}"
            assert waiting.error_message == (
                f"{NOT_FOUND}: Invalid response from http://{NOT_FOUND}{path}: 404"
            )
            assert waiting.status is CertificateStatus.PENDING and waiting.retry_count == 0
            assert stack.proxy.new_orders_for(hostname) == 1
            assert stack.ca.accepts(hostname, challenge) == 0
            assert stack.ca.invalid(hostname) == []
            print(f"[case 6b] redirector saw {redirector.requests}; 404 server saw {missing.requests}")
            assert (hostname, path) in redirector.requests  # Host: the hostname, no port
            assert (NOT_FOUND, path) in missing.requests
        finally:
            await client.cancel(hostname)
    finally:
        redirector.stop()
        missing.stop()
        stack.dns.set_a(ROUTE, ["127.0.0.1"])
    assert stack.ca.accepts(hostname, challenge) == 0


async def test_without_the_self_check_the_ca_charges_a_failed_validation(
    stack: DnsStack, clients: dict[str, CertflowClient]
) -> None:
    """Case 6 on a worker with CERTFLOW_HTTP01_SELF_CHECK=false (the control): the
    same unroutable edge (A 127.0.0.9) goes to the CA, which validates, fails, and
    counts a failed authorization: ACME_INVALID_ORDER with the CA's detail, one
    failure of the budget spent. This is what the self-check saves."""
    client = clients["unchecked"]
    hostname, _ = stack.customer("c6n", target=DEAD)
    await client.request([hostname])
    try:
        failed = await wait_for(
            client, hostname, has_code(ErrorCode.ACME_INVALID_ORDER), what="ACME_INVALID_ORDER"
        )
        show("case 6 without self-check", failed, stack)
        assert failed.retry_count == 1
        assert NOWHERE in (failed.error_message or ""), failed.error_message
        assert stack.proxy.new_orders_for(hostname) == 1
        assert stack.ca.accepts(hostname) == 1
        invalid = stack.ca.invalid(hostname)
        print(f"[case 6 without self-check] the CA answered invalid: {invalid}")
        assert invalid, "the CA never reported the failed validation"
    finally:
        await client.cancel(hostname)


# ------------------------------------------- the self-check fetches as the CA does (case 9)


def _challenge(hostname: str, port: int, path: str) -> bytes:
    """The challenge as the responder (main worker, 127.0.0.1) answers it for hostname."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": hostname})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body: bytes = response.read()
            return body
    except OSError:
        return b""


def _self_checks(stack: DnsStack, result: str, reason: str) -> float:
    """certflow_http01_self_check_total{result, reason} on the routed worker."""
    url = f"http://{stack.envs['routed']['CERTFLOW_METRICS_LISTEN']}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("certflow_http01_self_check_total{") and (
            f'result="{result}"' in line and f'reason="{reason}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_an_aaaa_that_refuses_falls_back_to_the_a_and_issues(
    stack: DnsStack, clients: dict[str, CertflowClient], db: asyncpg.Pool
) -> None:
    """Case 9a: the edge's AAAA is ::1, where nothing listens on the CA's port (an
    edge whose IPv6 is down), its A 127.0.0.1 answers. The CA tries the first
    AAAA, and only after that dial error the first A (va/http.go fallbackErr):
    the self-check passes, one accept, ACTIVE, nothing invalid.

    Pebble 2.4 dials only the first address it resolves and never falls back
    (va/va.go fetchHTTP: ``addrs[0]``), so — standing in for Boulder's fallback —
    the AAAA is withdrawn from DNS the moment the accept reaches the CA (a proxy
    hook before forwarding), after checking it was still there: the self-check
    met the refusing AAAA. Red before this change (every address had to answer):
    HTTP01_UNREACHABLE "… [::1]:… connection refused", no accept."""
    client = clients["routed"]
    hostname, _ = stack.customer("c9a", target=ROUTE)
    aaaa_at_accept: list[list[str]] = []

    def withdraw_aaaa(request: Arriving) -> None:
        if request.method == "POST" and request.payload == b"{}" and (
            urllib.parse.urlsplit(request.path).path in stack.ca.challenge_paths(hostname)
        ):
            answer = stack.dns.query(hostname, "AAAA")
            aaaa_at_accept.append([rd.to_text() for rrset in answer.answer for rd in rrset if rrset.rdtype == 28])
            stack.dns.set_aaaa(ROUTE, [])

    stack.dns.set_aaaa(ROUTE, ["::1"])
    remove = stack.proxy.before_forwarding(Endpoint.CHALLENGE, withdraw_aaaa)
    try:
        report = await issued(stack, client, hostname, "case 9a")
    finally:
        remove()
        stack.dns.set_aaaa(ROUTE, [])
    assert aaaa_at_accept == [["::1"]], aaaa_at_accept
    assert report.status is CertificateStatus.ACTIVE
    assert stack.ca.accepts(hostname) == 1
    await no_failure_on_the_way(client, hostname)


async def test_an_aaaa_lookup_that_servfails_is_no_failure(
    stack: DnsStack, clients: dict[str, CertflowClient]
) -> None:
    """Case 9b: the resolver answers SERVFAIL for the hostname's AAAA (a customer
    name server that fails one type) and the A normally. The CA looks both up
    together and fails only when both fail (va/dns.go getAddrs): the self-check
    passes and the CA (Pebble too: it ignores a failed AAAA answer) issues, at
    the first attempt. Red before this change: a failed AAAA lookup failed the
    self-check as ACME_TEMPORARY (a failure event, the budget spent; the kept
    order then skipped the self-check and was re-accepted after 5 s)."""
    client = clients["routed"]
    hostname, _ = stack.customer("c9b", target=ROUTE)
    stack.dns.fail_lookups(hostname, ["AAAA"])
    try:
        await issued(stack, client, hostname, "case 9b")
    finally:
        stack.dns.fail_lookups(hostname, [])
    assert stack.ca.accepts(hostname) == 1
    await no_failure_on_the_way(client, hostname)


async def no_failure_on_the_way(client: CertflowClient, hostname: str) -> None:
    """ACTIVE at the first attempt: no event on the way carries an error code."""
    events = await client.events(hostname)
    assert [e.error_code for e in events if e.error_code] == [], events


@pytest.mark.parametrize(
    ("case", "status", "location", "detail"),
    [
        ("c9c", 303, f"http://{RESERVED}{{path}}", "received disallowed redirect status code"),
        (
            "c9d",
            302,
            f"http://{RESERVED}{{path}}",
            "Invalid host in redirect target: IP address is in a reserved address block:"
            " [RFC1122], Section 3.2.1.3: Loopback",
        ),
        (
            "c9e",
            302,
            "http://elsewhere.{apex}{path}",
            "Invalid host in redirect target, must end in IANA registered TLD",
        ),
    ],
    ids=["303", "reserved-address", "not-an-iana-tld"],
)
async def test_a_redirect_the_ca_refuses_is_caught_before_the_ca(
    stack: DnsStack,
    clients: dict[str, CertflowClient],
    db: asyncpg.Pool,
    case: str,
    status: int,
    location: str,
    detail: str,
) -> None:
    """Case 9c-e: the edge redirects somewhere that answers the key authorization,
    but in a way the CA refuses (va/http.go processRedirect, extractRequestTarget):
    a 303, a reserved address (127.0.0.12: the routed worker, like a real CA, may
    connect to none but the loopback hosts the cases use), a host under no IANA
    TLD. HTTP01_UNREACHABLE in the CA's words, PENDING, budget untouched, no
    accept, the metric counted with reason ``redirect``. Red before this change:
    each was followed, the challenge answered, and the order accepted."""
    client = clients["routed"]
    port = stack.http01_port
    hostname, apex = stack.customer(case, target=ROUTE)
    elsewhere = f"elsewhere.{apex}"
    stack.dns.set_a(ROUTE, [REDIRECTOR])
    stack.dns.set_a(elsewhere, [RESERVED])
    redirector = HttpAnswerer(REDIRECTOR, port, lambda path: (
        status, {"Location": location.format(hostname=hostname, apex=apex, path=path)}
    ))
    # What the target answers is the real challenge (relayed from the responder),
    # so only the redirect itself can fail the check.
    target = HttpAnswerer(RESERVED, port, lambda path: (200, {}), body=lambda path: _challenge(hostname, port, path))
    before = _self_checks(stack, "error", "redirect")
    try:
        await client.request([hostname])
        try:
            waiting = await wait_for(
                client, hostname, has_code(ErrorCode.HTTP01_UNREACHABLE), what="HTTP01_UNREACHABLE"
            )
            show(case, waiting, stack)
            _, challenge = await open_challenge(db, hostname)
            path = f"/.well-known/acme-challenge/{await challenge_token(db, hostname)}"
            assert _challenge(hostname, port, path)  # the target would have answered it
            shown = location.format(hostname=hostname, apex=apex, path=path)
            assert waiting.error_message == f"{REDIRECTOR}: Fetching {shown}: {detail}"
            assert waiting.status is CertificateStatus.PENDING and waiting.retry_count == 0
            assert stack.ca.accepts(hostname, challenge) == 0
            assert stack.ca.invalid(hostname) == []
            assert target.requests == []  # never fetched from where the CA would not go
            assert _self_checks(stack, "error", "redirect") >= before + 1
        finally:
            await client.cancel(hostname)
    finally:
        redirector.stop()
        target.stop()
        stack.dns.set_a(ROUTE, ["127.0.0.1"])
    assert stack.ca.accepts(hostname, challenge) == 0


# ------------------------------------------- the CA refuses on CAA after we allowed (case 10)


async def dns_checks_run(client: CertflowClient, hostname: str) -> int:
    """check_dns activities the hostname's current workflow run has run (local
    ones, each a marker, and regular ones)."""
    history = await client.handle(hostname).fetch_history()
    return sum(1 for name in activities_run(history) if name == "check_dns")


async def test_a_ca_refusing_on_caa_is_believed_until_caa_changes(
    stack: DnsStack, clients: dict[str, CertflowClient]
) -> None:
    """Case 10: our CAA check allows (no CAA anywhere) but the CA's validation fails
    with a ``caa`` problem (Boulder's detail, played by the proxy: Pebble checks no
    CAA). One failure counted (retry_count 1, ACME_CAA), then re-checks of DNS every
    backoff order nothing while the CAA answer is unchanged (the message says the CA
    disagreed and what we read); once the answer changes, one new order, ACTIVE.
    Red before this change: ``caa`` was DNS_CAA with the budget untouched and every
    re-check ordered again (one failed authorization each, 24 a day)."""
    client = clients["main"]
    hostname, apex = stack.customer("c10")
    detail = f"While processing CAA for {hostname}: CAA record for {apex} prevents issuance"
    stack.proxy.fail_validation(hostname, "urn:ietf:params:acme:error:caa", detail)
    try:
        await client.request([hostname])
        held = await wait_for(
            client,
            hostname,
            lambda r: r.error_code is ErrorCode.DNS_CAA or r.status is CertificateStatus.ACTIVE,
            what="the CA's refusal held",
        )
        show("case 10", held, stack)
        message = held.error_message or ""
        assert "refused on CAA although our check allows it" in message and detail in message
        assert "we read no CAA records up to the TLD" in message
        assert held.retry_count == 1
        events = await client.events(hostname)
        assert [e.error_code for e in events if e.error_code][:1] == [ErrorCode.ACME_CAA]
        # Re-checks go on (DNS backoff 1-2 s here), ordering nothing.
        checks = await dns_checks_run(client, hostname)
        deadline = time.monotonic() + 60
        while await dns_checks_run(client, hostname) < checks + 3:
            assert time.monotonic() < deadline, "no DNS re-checks"
            await asyncio.sleep(0.2)
        assert stack.proxy.new_orders_for(hostname) == 1
        now = await client.status(hostname)
        assert now is not None and now.retry_count == 1  # nothing more spent

        stack.proxy.pass_validation(hostname)
        stack.dns.set_caa(apex, [(0, "issue", ISSUER)])  # the answer changes
        active = await wait_for(client, hostname, is_active, what="ACTIVE after CAA changed")
        show("case 10", active, stack)
        assert stack.proxy.new_orders_for(hostname) == 2
    finally:
        stack.proxy.pass_validation(hostname)


# -------------------------------------------- one POST per challenge, however slow (case 11)


async def test_a_slow_failing_validation_is_posted_once(
    stack: DnsStack, clients: dict[str, CertflowClient], db: asyncpg.Pool
) -> None:
    """Case 11: the CA takes 8 s to fail the validation (played by the proxy: the
    challenge reads ``pending`` meanwhile, as Boulder shows it), then reports a
    timeout. The challenge is POSTed once, counted at the proxy: Boulder starts a
    second validation for a second POST and counts each failure (ra.go
    PerformValidation). One failure counted, ACME_INVALID_ORDER with the CA's
    detail. Red before this change: a challenge still pending after 5 s was
    POSTed again (two accepts, the budget spent twice at the CA)."""
    client = clients["main"]
    hostname, _ = stack.customer("c11")
    detail = (
        f"127.0.0.1: Fetching http://{hostname}/.well-known/acme-challenge/x:"
        " Timeout after connect (your server may be slow or overloaded)"
    )
    stack.proxy.fail_validation(
        hostname, "urn:ietf:params:acme:error:connection", detail, takes=8.0
    )
    try:
        await client.request([hostname])
        failed = await wait_for(
            client, hostname, has_code(ErrorCode.ACME_INVALID_ORDER), what="ACME_INVALID_ORDER"
        )
        show("case 11", failed, stack)
        assert detail in (failed.error_message or "")
        assert failed.retry_count == 1
        # Every challenge the CA showed was POSTed once at most (the next order's
        # may have started meanwhile), the failed one exactly once.
        accepts = {p: stack.ca.accepts(hostname, p) for p in stack.ca.challenge_paths(hostname)}
        print(f"[case 11] accepts per challenge: {accepts}")
        assert sum(accepts.values()) >= 1 and max(accepts.values()) == 1, accepts
    finally:
        stack.proxy.pass_validation(hostname)
        await client.cancel(hostname)


# ------------------------------------------------------------------ a long name (case 7)


async def test_a_70_character_hostname_is_ordered_san_only(
    stack: DnsStack, clients: dict[str, CertflowClient], db: asyncpg.Pool
) -> None:
    """Case 7: a hostname longer than the 64 octets a CN may hold (RFC 5280
    ub-common-name) is issued: certflow's CSR, as the CA received it at finalize,
    has an empty subject and the name as its only SAN; the certificate names it in
    its SAN. (Pebble 2.4 copies the first SAN into the certificate's CN whatever
    its length — ca.newCertificate — so the certificate's subject is Pebble's
    doing, not certflow's, and is only printed; Let's Encrypt leaves a name over
    64 octets out of the CN.)"""
    apex = f"c7-{uuid.uuid4().hex[:8]}.test"  # 16 characters
    hostname = f"{'a' * (70 - len(apex) - 1)}.{apex}"
    assert len(hostname) == 70
    stack.dns.set_cname(hostname, EDGE)
    await issued(stack, clients["main"], hostname, "case 7")

    (csr,) = stack.ca.csrs(hostname)
    csr_san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    print(f"[case 7] CSR subject {csr.subject.rfc4514_string()!r}; SAN {csr_san.get_values_for_type(x509.DNSName)}")
    assert list(csr.subject) == []
    assert csr_san.get_values_for_type(x509.DNSName) == [hostname]

    pem = await db.fetchval("SELECT ssl_certificate FROM certificates WHERE hostname = $1", hostname)
    leaf = x509.load_pem_x509_certificate(pem.encode())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    with warnings.catch_warnings():  # cryptography warns about Pebble's 70-character CN
        warnings.simplefilter("ignore", UserWarning)
        subject = leaf.subject.rfc4514_string()
    print(f"[case 7] certificate subject (Pebble's) {subject!r}; SAN {san.get_values_for_type(x509.DNSName)}")
    assert san.get_values_for_type(x509.DNSName) == [hostname]


# ------------------------------------------------------------ starter.py check (case 8)


def run_check(stack: DnsStack, args: Sequence[str], worker: str = "main") -> subprocess.CompletedProcess[str]:
    """``python starter.py check ARGS`` as an operator runs it, with only these variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
    return subprocess.run(
        [sys.executable, "starter.py", "check", *args],
        cwd=ROOT,
        env={**clean, **stack.client_env(worker)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def check_lines(output: str) -> dict[str, tuple[str, str]]:
    """``  name    ok   message`` lines → name: (ok|FAIL, message); the validation
    methods' lines (``  method …``, ``    add: …``) are not checks."""
    found = {}
    for line in output.splitlines():
        if line.startswith("  ") and not line.startswith(("  method ", "    ")):
            name, verdict, message = line.strip().split(None, 2)
            found[name] = (verdict, message)
    return found


async def check(stack: DnsStack, hostname: str, worker: str = "main", *flags: str) -> subprocess.CompletedProcess[str]:
    result = await asyncio.to_thread(run_check, stack, [hostname, *flags], worker)
    print(f"\n$ starter.py check {hostname} {' '.join(flags)} -> exit {result.returncode}\n{result.stdout}{result.stderr}")
    return result


async def domain_check_ids(client: CertflowClient) -> list[str]:
    query = f"WorkflowType = '{DOMAIN_CHECK_WORKFLOW}' AND TaskQueue = '{client.task_queue}'"
    return [w.id async for w in client.temporal.list_workflows(query)]


async def test_starter_check(stack: DnsStack, clients: dict[str, CertflowClient]) -> None:
    """Case 8: ``starter.py check`` through the CLI on the same cases: exit 0 and
    three ``ok`` lines for a good hostname; exit 1 with the failing check and its
    message for cases 1, 3, 4 and 6; ``--json`` carries ``ok: false`` and the code;
    an invalid hostname exits 2 with one line and starts no DomainCheck workflow.
    Nothing is ordered by any check."""
    good, _ = stack.customer("c8")
    result = await check(stack, good)
    assert result.returncode == 0, result.stderr
    lines = check_lines(result.stdout)
    assert {n: v for n, (v, _) in lines.items()} == {"cname": "ok", "caa": "ok", "http01": "ok"}
    assert len(check_lines(result.stdout)) == 3
    assert result.stdout.splitlines()[0] == f"{good}: ok"

    # Case 1 (and --json).
    c1, _ = stack.customer("c8-1")
    with stack.edge_caa((0, "issue", "digicert.com")):
        result = await check(stack, c1)
        assert result.returncode == 1
        assert check_lines(result.stdout)["caa"] == ("FAIL", f"{via(c1, EDGE)} allows only digicert.com")
        assert check_lines(result.stdout)["cname"][0] == "ok"
        as_json = await check(stack, c1, "main", "--json")
        assert as_json.returncode == 1
        (report,) = json.loads(as_json.stdout)
        assert report["hostname"] == c1 and report["ok"] is False
        caa = next(c for c in report["checks"] if c["name"] == "caa")
        assert (caa["ok"], caa["code"]) == (False, "DNS_CAA")

    # Case 3.
    c3, apex = stack.customer("c8-3")
    stack.dns.set_caa(apex, [(0, "issue", "sectigo.com")])
    result = await check(stack, c3)
    assert result.returncode == 1
    assert check_lines(result.stdout)["caa"] == (
        "FAIL", f"CAA at {apex} allows only sectigo.com (applies to {c3})"
    )

    # Case 4.
    c4, _ = stack.customer("c8-4")
    with stack.edge_caa((0, "issue", f"{ISSUER}; validationmethods=dns-01")):
        result = await check(stack, c4)
    assert result.returncode == 1
    verdict, message = check_lines(result.stdout)["caa"]
    assert verdict == "FAIL" and "only with validationmethods=dns-01" in message

    # Case 6, on the routed worker (its CNAME target is the unroutable name).
    stack.dns.set_a(ROUTE, [NOWHERE])
    try:
        c6, _ = stack.customer("c8-6", target=ROUTE)
        result = await check(stack, c6, "routed")
    finally:
        stack.dns.set_a(ROUTE, ["127.0.0.1"])
    assert result.returncode == 1
    lines = check_lines(result.stdout)
    assert lines["cname"][0] == lines["caa"][0] == "ok"
    verdict, message = lines["http01"]
    assert verdict == "FAIL" and message.startswith(f"{NOWHERE}: Fetching http://{c6}/")
    assert message.endswith(": Connection refused")

    for hostname in (good, c1, c3, c4, c6):
        assert stack.proxy.new_orders_for(hostname) == 0, f"check ordered {hostname}"

    # An invalid hostname: one line, exit 2, nothing started. A valid check run after
    # it shows the visibility store has caught up when its workflow is listed.
    bad = f"bad_name.c8-{uuid.uuid4().hex[:8]}.test"
    result = await check(stack, bad)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("certflow: invalid hostname"), result.stderr
    sentinel, _ = stack.customer("c8-after")
    assert (await check(stack, sentinel)).returncode == 0
    client = clients["main"]
    deadline = time.monotonic() + 30
    while True:
        ids = await domain_check_ids(client)
        if any(i.startswith(f"check:{sentinel}:") for i in ids):
            break
        assert time.monotonic() < deadline, f"the sentinel's DomainCheck never listed: {ids}"
        await asyncio.sleep(0.1)
    print(f"[case 8] DomainCheck workflows on {client.task_queue}: {len(ids)}")
    assert not [i for i in ids if bad.lower() in i.lower()], ids
    for hostname in (good, c1, c3, c4):
        assert any(i.startswith(f"check:{hostname}:") for i in ids), (hostname, ids)
