"""The fault proxy in front of a real Pebble, driven by the real ``acme`` client."""

from __future__ import annotations

import datetime
import http.client
import math
import re
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import josepy
import pytest
import requests
from acme import client, crypto_util, errors, messages
from acme.client import _renewal_info_path_component
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from josepy import json_util
from josepy.jwk import JWKEC

from certflow.acme.network import classify_acme_failure
from devstack import servers
from devstack.servers import PebbleStack
from devstack.faultproxy import (
    CERTIFICATES_PER_DOMAIN,
    NEW_ORDERS_PER_ACCOUNT,
    Bucket,
    Endpoint,
    Fault,
    FaultProxy,
    LimitsConfig,
    OrderKind,
    ari_cert_id,
    classify_path,
    go_duration,
    start_fault_proxy,
)
from certflow.errors import ErrorCode

pytestmark = pytest.mark.e2e  # real binaries: out of the fast tier


@pytest.fixture(scope="module")
def pebble_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pebble-faultproxy")


@pytest.fixture(scope="module")
def pebble(pebble_dir: Path) -> Iterator[PebbleStack]:
    # va_always_valid lets the full-issuance test finish without an HTTP-01 responder.
    stack = servers.start_pebble(pebble_dir, nonce_reject_percent=0, va_always_valid=True)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def proxy(pebble: PebbleStack, pebble_dir: Path) -> Iterator[FaultProxy]:
    fp = start_fault_proxy(pebble, pebble_dir)
    try:
        yield fp
    finally:
        fp.stop()


@dataclass
class Acme:
    client: client.ClientV2
    responses: list[requests.Response] = field(default_factory=list)

    def new_order(self, host: str) -> requests.Response:
        order = messages.NewOrder(
            identifiers=[messages.Identifier(typ=messages.IDENTIFIER_FQDN, value=host)]
        )
        return self.client.net.post(
            self.client.directory["newOrder"],
            order,
            new_nonce_url=self.client.directory["newNonce"],
        )

    def last(self, path_part: str) -> requests.Response:
        return next(r for r in reversed(self.responses) if path_part in r.url)


def _acme(pebble: PebbleStack, directory_url: str) -> Acme:
    key = JWKEC(key=ec.generate_private_key(ec.SECP256R1()))
    # acme types verify_ssl as bool, but requests takes a CA bundle path there.
    verify: Any = str(pebble.ca_bundle)
    net = client.ClientNetwork(key, alg=josepy.jwa.ES256, verify_ssl=verify)
    acme = Acme(client.ClientV2(client.ClientV2.get_directory(directory_url, net), net))

    def hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        acme.responses.append(response)

    net.session.hooks["response"].append(hook)
    regr = acme.client.new_account(
        messages.NewRegistration.from_data(terms_of_service_agreed=True)
    )
    net.account = regr
    return acme


def test_classify_pebble_paths() -> None:
    assert classify_path("/dir") is Endpoint.DIRECTORY
    assert classify_path("/nonce-plz") is Endpoint.NONCE
    assert classify_path("/sign-me-up") is Endpoint.NEW_ACCOUNT
    assert classify_path("/order-plz") is Endpoint.NEW_ORDER
    assert classify_path("/my-order/abc") is Endpoint.ORDER
    assert classify_path("/authZ/abc") is Endpoint.AUTHZ
    assert classify_path("/chalZ/abc") is Endpoint.CHALLENGE
    assert classify_path("/finalize-order/abc") is Endpoint.FINALIZE
    assert classify_path("/certZ/abc?x=1") is Endpoint.CERT
    assert classify_path("/my-account/1") is Endpoint.OTHER


def test_fault_needs_status_or_drop() -> None:
    with pytest.raises(ValueError):
        Fault()
    assert Fault.dropped().drop
    assert Fault.rate_limited().retry_after == "30"


def test_pass_through_keeps_client_on_proxy(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    directory = acme.client.directory
    assert directory["newOrder"] == f"{proxy.url}/order-plz"
    assert directory["newNonce"] == f"{proxy.url}/nonce-plz"
    assert acme.client.net.account is not None
    assert acme.client.net.account.uri.startswith(proxy.url + "/")

    response = acme.new_order("pass.example.com")
    assert response.status_code == 201
    assert response.headers["Location"].startswith(f"{proxy.url}/my-order/")
    body = response.json()
    assert body["finalize"].startswith(f"{proxy.url}/finalize-order/")
    [authz_url] = body["authorizations"]
    assert authz_url.startswith(f"{proxy.url}/authZ/")

    # POST-as-GET on the authz, through the proxy: challenge URLs point at it too.
    authz = acme.client._post_as_get(authz_url).json()
    assert authz["identifier"]["value"] == "pass.example.com"
    assert all(ch["url"].startswith(f"{proxy.url}/chalZ/") for ch in authz["challenges"])

    assert proxy.count(Endpoint.DIRECTORY) == 1
    assert proxy.count(Endpoint.NONCE) == 1  # later nonces come from Replay-Nonce
    assert proxy.count(Endpoint.NEW_ACCOUNT) == 1
    assert proxy.count(Endpoint.NEW_ORDER) == 1
    assert proxy.count(Endpoint.AUTHZ) == 1
    assert proxy.forwarded(Endpoint.NEW_ORDER) == 1
    assert proxy.new_orders_for("pass.example.com") == 1
    assert proxy.new_orders_for("PASS.example.com.") == 1
    assert proxy.new_orders_for("other.example.com") == 0


def test_rate_limited_new_order(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    host = "limited.example.com"
    proxy.inject(Endpoint.NEW_ORDER, Fault.rate_limited("30"))

    with pytest.raises(messages.Error) as caught:
        acme.new_order(host)
    assert caught.value.typ.endswith(":rateLimited")
    faulted = acme.last("/order-plz")
    assert faulted.status_code == 429
    assert faulted.headers["Retry-After"] == "30"
    assert faulted.headers["Content-Type"] == "application/problem+json"
    assert faulted.headers["Replay-Nonce"]  # still a well-formed ACME error response
    assert proxy.new_orders_for(host) == 0
    assert proxy.pending(Endpoint.NEW_ORDER) == 0

    # The queue is used up: the next new order reaches Pebble.
    assert acme.new_order(host).status_code == 201
    assert proxy.count(Endpoint.NEW_ORDER) == 2
    assert proxy.forwarded(Endpoint.NEW_ORDER) == 1
    assert proxy.new_orders_for(host) == 1


def test_retry_after_http_date_is_verbatim(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    when = "Wed, 21 Oct 2037 07:28:00 GMT"
    proxy.inject(Endpoint.NEW_ORDER, Fault.rate_limited(when), Fault.unavailable(when))

    with pytest.raises(messages.Error):
        acme.new_order("date.example.com")
    assert acme.last("/order-plz").headers["Retry-After"] == when
    with pytest.raises(errors.ClientError):
        acme.new_order("date.example.com")
    assert acme.last("/order-plz").status_code == 503
    assert acme.last("/order-plz").headers["Retry-After"] == when
    assert proxy.forwarded(Endpoint.NEW_ORDER) == 0


def test_plain_server_errors_are_client_errors(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    proxy.inject(Endpoint.NEW_ORDER, Fault.server_error(), Fault.unavailable())

    for status in (500, 503):
        with pytest.raises(errors.ClientError) as caught:
            acme.new_order("plain.example.com")
        assert not isinstance(caught.value, messages.Error)
        response = acme.last("/order-plz")
        assert response.status_code == status
        assert "Retry-After" not in response.headers
        assert response.headers["Content-Type"].startswith("text/plain")

    assert acme.new_order("plain.example.com").status_code == 201
    assert proxy.count(Endpoint.NEW_ORDER) == 3
    assert proxy.forwarded(Endpoint.NEW_ORDER) == 1


def test_dropped_connection(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    proxy.inject(Endpoint.NEW_ORDER, Fault.dropped())

    with pytest.raises(requests.ConnectionError):
        acme.new_order("drop.example.com")
    assert proxy.count(Endpoint.NEW_ORDER) == 1
    assert proxy.forwarded(Endpoint.NEW_ORDER) == 0

    # The client reconnects (its pooled connection is gone) and gets through.
    assert acme.new_order("drop.example.com").status_code == 201
    assert proxy.new_orders_for("drop.example.com") == 1


def test_inject_always_until_cleared(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    proxy.reset_counts()
    proxy.inject_always(Endpoint.NEW_ORDER, Fault.unavailable("5"))
    for _ in range(3):
        with pytest.raises(errors.ClientError):
            acme.new_order("always.example.com")
    proxy.inject_always(Endpoint.NEW_ORDER, None)
    assert acme.new_order("always.example.com").status_code == 201

    proxy.inject(Endpoint.NEW_ORDER, Fault.server_error())
    proxy.inject_always(Endpoint.NEW_ORDER, Fault.server_error())
    proxy.clear()
    assert acme.new_order("always.example.com").status_code == 201

    assert proxy.count(Endpoint.NEW_ORDER) == 5
    assert proxy.forwarded(Endpoint.NEW_ORDER) == 2
    assert proxy.new_orders_for("always.example.com") == 2
    proxy.reset_counts()
    assert proxy.count(Endpoint.NEW_ORDER) == 0
    assert proxy.new_orders_for("always.example.com") == 0


def test_faulted_nonce_endpoint(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    acme.client.net._nonces.clear()  # force a newNonce round trip
    proxy.inject(Endpoint.NONCE, Fault.unavailable("1"))
    with pytest.raises(errors.ClientError):
        acme.new_order("nonce.example.com")
    response = acme.last("/nonce-plz")
    assert response.status_code == 503
    assert "Replay-Nonce" not in response.headers
    assert acme.new_order("nonce.example.com").status_code == 201


def test_full_issuance_through_proxy(pebble: PebbleStack, proxy: FaultProxy) -> None:
    acme = _acme(pebble, proxy.directory_url)
    proxy.reset_counts()
    host = "issue.example.com"
    key_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    order = acme.client.new_order(crypto_util.make_csr(key_pem, [host]))
    assert order.uri is not None and order.uri.startswith(f"{proxy.url}/my-order/")
    [authz] = order.authorizations
    challenge = next(c for c in authz.body.challenges if c.chall.typ == "http-01")
    assert challenge.uri.startswith(f"{proxy.url}/chalZ/")
    account_key = acme.client.net.key
    acme.client.answer_challenge(challenge, challenge.response(account_key))
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=15)
    done = acme.client.poll_and_finalize(order, deadline)
    assert done.body.certificate is not None
    assert done.body.certificate.startswith(f"{proxy.url}/certZ/")
    assert "BEGIN CERTIFICATE" in (done.fullchain_pem or "")

    assert proxy.count(Endpoint.NEW_ORDER) == proxy.forwarded(Endpoint.NEW_ORDER) == 1
    assert proxy.new_orders_for(host) == 1
    assert proxy.count(Endpoint.CHALLENGE) == 1
    assert proxy.count(Endpoint.AUTHZ) >= 1
    assert proxy.count(Endpoint.FINALIZE) == 1
    assert proxy.count(Endpoint.CERT) == 1
    assert proxy.count(Endpoint.DIRECTORY) == proxy.count(Endpoint.OTHER) == 0


def test_a_failed_validation_never_comes_back_in_a_later_order(
    pebble: PebbleStack, proxy: FaultProxy
) -> None:
    """A validation the proxy fails is Boulder's: the challenge reads pending, then
    its authorization invalid with the problem; a second accept gets Boulder's
    "authorization must be pending"; and no later order is handed that
    authorization (Boulder never reuses an invalid one). Red with the failing accept
    forwarded to Pebble, as before: its answer read invalid at once; with only that
    assertion dropped, Pebble (always valid here) had validated the authorization
    behind the proxy and, at its 50 % reuse, the second later order came back with
    it. In the real-DNS tests Pebble reuses at ``PEBBLE_AUTHZREUSE=0`` too, one
    order in a hundred (wfe.go: ``rand.Intn(100) > percent``): case 10's second
    order then read the CAA refusal again (two CI runs red)."""
    acme = _acme(pebble, proxy.directory_url)
    host = "refused.example.com"
    detail = "While processing CAA for refused.example.com: CAA record for example.com prevents issuance"
    proxy.fail_validation(host, "urn:ietf:params:acme:error:caa", detail)
    try:
        order = acme.client.new_order(_csr(host))
        [authz] = order.authorizations
        challenge = next(c for c in authz.body.challenges if c.chall.typ == "http-01")
        accepted = acme.client.answer_challenge(challenge, challenge.response(acme.client.net.key))
        assert accepted.body.status == messages.STATUS_PENDING
        assert accepted.authzr_uri == authz.uri
        failed, _ = acme.client.poll(authz)
        assert failed.body.status == messages.STATUS_INVALID
        [shown] = [c for c in failed.body.challenges if c.chall.typ == "http-01"]
        assert shown.error is not None and shown.error.typ.endswith(":caa") and shown.error.detail == detail
        with pytest.raises(messages.Error) as again:
            acme.client.answer_challenge(challenge, challenge.response(acme.client.net.key))
        assert again.value.typ.endswith(":malformed") and again.value.detail is not None
        assert "authorization must be pending" in again.value.detail
    finally:
        proxy.pass_validation(host)
    for _ in range(8):
        later = acme.client.new_order(_csr(host))
        [fresh] = later.authorizations
        assert fresh.uri != authz.uri
        assert fresh.body.status == messages.STATUS_PENDING


def _csr(host: str) -> bytes:
    key_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return crypto_util.make_csr(key_pem, [host])


def test_each_fault_taken_is_put_down_to_its_hostname(pebble: PebbleStack, proxy: FaultProxy) -> None:
    """Two hostnames' orders; faults on new-order, the authorization, the challenge,
    finalize and the certificate download are each put down to the hostname whose
    request took them (learned from Pebble's answers), not to the other one."""
    acme = _acme(pebble, proxy.directory_url)
    ours, theirs = "ours.example.com", "theirs.example.com"
    key_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    proxy.inject(Endpoint.NEW_ORDER, Fault.unavailable())
    with pytest.raises(errors.Error):
        acme.client.new_order(crypto_util.make_csr(key_pem, [ours]))
    other = acme.client.new_order(crypto_util.make_csr(key_pem, [theirs]))
    order = acme.client.new_order(crypto_util.make_csr(key_pem, [ours]))
    [authz] = order.authorizations
    assert order.uri is not None
    for endpoint in (Endpoint.AUTHZ, Endpoint.ORDER):
        proxy.inject(endpoint, Fault.unavailable())
    with pytest.raises(errors.Error):
        acme.client.poll(authz)
    acme.client.poll(other.authorizations[0])  # the fault was taken: this passes
    with pytest.raises(errors.Error):
        acme.client.net.post(order.uri, None, new_nonce_url=acme.client.directory["newNonce"])
    challenge = next(c for c in authz.body.challenges if c.chall.typ == "http-01")
    proxy.inject(Endpoint.CHALLENGE, Fault.unavailable())
    with pytest.raises(errors.Error):
        acme.client.answer_challenge(challenge, challenge.response(acme.client.net.key))
    acme.client.answer_challenge(challenge, challenge.response(acme.client.net.key))
    proxy.inject(Endpoint.CERT, Fault.unavailable())
    with pytest.raises(errors.Error):
        acme.client.poll_and_finalize(order, datetime.datetime.now() + datetime.timedelta(seconds=15))

    assert proxy.faults_taken_by(ours) == [
        Endpoint.NEW_ORDER, Endpoint.AUTHZ, Endpoint.ORDER, Endpoint.CHALLENGE, Endpoint.CERT
    ]
    assert proxy.faults_taken_by(theirs) == []
    assert proxy.faults_taken(Endpoint.AUTHZ) == [frozenset({ours})]


def test_concurrent_requests_consume_each_fault_once(
    pebble: PebbleStack, proxy: FaultProxy
) -> None:
    proxy.inject(Endpoint.DIRECTORY, *[Fault.unavailable()] * 5)
    statuses: list[int] = []
    lock = threading.Lock()

    def fetch() -> None:
        with requests.Session() as session:
            for _ in range(4):
                status = session.get(proxy.directory_url, verify=str(pebble.ca_bundle)).status_code
                with lock:
                    statuses.append(status)

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(statuses) == [200] * 27 + [503] * 5
    assert proxy.count(Endpoint.DIRECTORY) == 32
    assert proxy.forwarded(Endpoint.DIRECTORY) == 27


def test_stop_closes_kept_alive_connections(pebble: PebbleStack, pebble_dir: Path) -> None:
    before = {t.ident for t in threading.enumerate()}
    proxy = start_fault_proxy(pebble, pebble_dir)
    context = ssl.create_default_context(cafile=str(pebble.ca_bundle))
    port = int(proxy.url.rsplit(":", 1)[1])
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    session = requests.Session()
    try:
        # Keep-alive: several requests on one connection.
        for method, path in (("GET", "/dir"), ("HEAD", "/nonce-plz"), ("GET", "/nonce-plz")):
            conn.request(method, path)
            answer = conn.getresponse()
            body = answer.read()
            assert answer.status in (200, 204)
            assert answer.getheader("Connection") != "close"
            if path == "/dir":
                assert f"{proxy.url}/order-plz".encode() in body
            else:
                assert answer.getheader("Replay-Nonce")
        assert session.get(proxy.directory_url, verify=str(pebble.ca_bundle)).ok

        proxy.stop()  # with conn and the session's connection still open
        proxy.stop()  # idempotent
        leftover = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        assert leftover == []
        with pytest.raises(requests.ConnectionError):
            requests.get(proxy.directory_url, verify=str(pebble.ca_bundle), timeout=5)
    finally:
        session.close()
        conn.close()
        proxy.stop()


# ------------------------------------------------------------ the limits emulator

LIMITS_DOCS = "https://letsencrypt.org/docs/rate-limits/"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


class FakeClock:
    """The buckets' clock, advanced by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ReplacingOrder(messages.NewOrder):
    """A new order naming the certificate it replaces (RFC 9773 §5)."""

    replaces: str | None = json_util.field("replaces", omitempty=True)


def _account(acme: Acme) -> str:
    assert acme.client.net.account is not None
    return str(acme.client.net.account.uri)


BOGUS_IDENTIFIER = messages.IdentifierType("bogus")  # Pebble refuses this type (400)


def _order(
    acme: Acme,
    host: str,
    replaces: str | None = None,
    typ: messages.IdentifierType = messages.IDENTIFIER_FQDN,
) -> requests.Response:
    """POST new-order; an error answer is returned, not raised."""
    order = ReplacingOrder(
        identifiers=[messages.Identifier(typ=typ, value=host)],
        replaces=replaces,
    )
    try:
        return acme.client.net.post(
            acme.client.directory["newOrder"], order, new_nonce_url=acme.client.directory["newNonce"]
        )
    except messages.Error:
        return acme.last("/order-plz")


def _issue(acme: Acme, host: str) -> x509.Certificate:
    """A full issuance for host through the proxy (Pebble accepts every challenge)."""
    key_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    order = acme.client.new_order(crypto_util.make_csr(key_pem, [host]))
    [authz] = order.authorizations
    challenge = next(c for c in authz.body.challenges if c.chall.typ == "http-01")
    acme.client.answer_challenge(challenge, challenge.response(acme.client.net.key))
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=15)
    done = acme.client.poll_and_finalize(order, deadline)
    assert done.fullchain_pem
    return x509.load_pem_x509_certificate(done.fullchain_pem.encode())


def test_go_duration_prints_periods_as_boulder() -> None:
    assert [go_duration(s) for s in (20, 90, 3600, 168 * 3600, 1.5, 0.5, 0)] == [
        "20s", "1m30s", "1h0m0s", "168h0m0s", "1.5s", "500ms", "0s",
    ]
    with pytest.raises(ValueError):
        Bucket(0, period=1.0)
    with pytest.raises(ValueError):
        Bucket(1, period=0.0)


def test_limits_refusal_is_boulders_answer(pebble: PebbleStack, proxy: FaultProxy) -> None:
    clock = FakeClock()
    proxy.emulate_limits(LimitsConfig(new_orders=Bucket(2, period=20.0), clock=clock))
    acme = _acme(pebble, proxy.directory_url)
    account = _account(acme)
    assert _order(acme, "one.example.com").status_code == 201
    assert _order(acme, "two.example.com").status_code == 201
    assert proxy.limit_remaining(NEW_ORDERS_PER_ACCOUNT, account) == 0

    sent_at = time.time()
    refused = _order(acme, "three.example.com")
    assert refused.status_code == 429
    assert refused.headers["Content-Type"] == "application/problem+json"
    problem = refused.json()
    assert set(problem) == {"type", "detail", "status"}
    assert problem["type"] == "urn:ietf:params:acme:error:rateLimited"
    assert problem["status"] == 429
    detail = problem["detail"]
    assert re.fullmatch(
        rf"too many new orders \(2\) from this account in the last 20s, retry after ({STAMP}):"
        rf" see {re.escape(LIMITS_DOCS)}#new-orders-per-account",
        detail,
    ), detail
    # One token comes back every 20 s / 2 = 10 s; Boulder adds up to 3 % jitter.
    retry_after = int(refused.headers["Retry-After"])
    assert 10 <= retry_after <= math.ceil(10 * 1.03)
    stamp = re.search(STAMP, detail)
    assert stamp is not None
    retry_at = datetime.datetime.strptime(stamp.group(0), "%Y-%m-%d %H:%M:%S UTC").replace(
        tzinfo=datetime.timezone.utc
    )
    assert sent_at + 9 <= retry_at.timestamp() + 1 and retry_at.timestamp() <= time.time() + 11
    assert refused.headers["Link"] == '<https://letsencrypt.org/docs/rate-limits>;rel="help"'
    assert refused.headers["Replay-Nonce"]
    assert proxy.forwarded(Endpoint.NEW_ORDER) == 2 and proxy.count(Endpoint.NEW_ORDER) == 3
    assert proxy.new_orders_for("three.example.com") == 0

    # certflow reads it as Let's Encrypt's: the account's limit, the wait it asked for.
    err = classify_acme_failure(messages.Error.from_json(problem))
    assert err.code is ErrorCode.ACME_RATE_LIMITED
    assert (err.limit_scope, err.limit_name) == ("account", "NewOrdersPerAccount")

    # The nonce it carried is good: the next request signs with it alone (acme drops
    # the nonces of error answers, so hand it over).
    acme.client.net._nonces.clear()
    acme.client.net._add_nonce(refused)
    nonces = proxy.count(Endpoint.NONCE)
    clock.now += 10.0
    assert _order(acme, "three.example.com").status_code == 201
    assert proxy.count(Endpoint.NONCE) == nonces

    decisions = proxy.limit_decisions()
    assert [d.allowed for d in decisions] == [True, True, False, True]
    denied = decisions[2]
    assert (denied.limit, denied.key, denied.retry_after) == (
        NEW_ORDERS_PER_ACCOUNT, account, retry_after,
    )
    assert denied.kind is OrderKind.NEW and denied.detail == detail
    assert proxy.limit_counts()[(NEW_ORDERS_PER_ACCOUNT, account, "refused")] == 1
    assert proxy.limit_counts()[(NEW_ORDERS_PER_ACCOUNT, account, "allowed")] == 3


def test_limits_bucket_refills_after_the_scaled_period(
    pebble: PebbleStack, proxy: FaultProxy
) -> None:
    clock = FakeClock()
    proxy.emulate_limits(LimitsConfig(new_orders=Bucket(3, period=30.0), clock=clock))
    acme = _acme(pebble, proxy.directory_url)
    account = _account(acme)

    def burst() -> list[int]:
        return [_order(acme, f"refill{i}.example.com").status_code for i in range(4)]

    assert burst() == [201, 201, 201, 429]
    clock.now += 9.9  # a token every 10 s: not yet
    assert _order(acme, "early.example.com").status_code == 429
    clock.now += 0.1
    assert [_order(acme, f"trickle{i}.example.com").status_code for i in range(2)] == [201, 429]
    clock.now += 30.0  # a whole period: full again, no more
    assert proxy.limit_remaining(NEW_ORDERS_PER_ACCOUNT, account) == 3
    assert burst() == [201, 201, 201, 429]
    # Refunded when Pebble does not create the order (it refuses this name).
    clock.now += 30.0
    assert _order(acme, "bogus.example.com", typ=BOGUS_IDENTIFIER).status_code == 400
    assert proxy.limit_remaining(NEW_ORDERS_PER_ACCOUNT, account) == 3
    assert [s.cause for s in proxy.limit_spends()][-2:] == ["new-order", "refund"]

    # On the real clock too: a client that waits the Retry-After gets through.
    proxy.emulate_limits(LimitsConfig(new_orders=Bucket(1, period=1.0)))
    assert _order(acme, "real1.example.com").status_code == 201
    refused = _order(acme, "real2.example.com")
    assert refused.status_code == 429
    time.sleep(int(refused.headers["Retry-After"]))
    assert _order(acme, "real2.example.com").status_code == 201


def test_limits_certificates_per_domain_and_the_renewal_exemption(
    pebble: PebbleStack, proxy: FaultProxy
) -> None:
    proxy.emulate_limits(
        LimitsConfig(new_orders=Bucket(3, period=3600.0), per_domain=Bucket(1, period=3600.0))
    )
    acme = _acme(pebble, proxy.directory_url)
    account = _account(acme)

    # Boulder only checks CertificatesPerDomain at new-order: an order placed before
    # the first certificate is issued passes too.
    leaf = _issue(acme, "a.example.com")
    spends = [(s.limit, s.key, s.cause) for s in proxy.limit_spends()]
    assert spends == [
        (NEW_ORDERS_PER_ACCOUNT, account, "new-order"),
        (CERTIFICATES_PER_DOMAIN, "example.com", "issuance"),
    ]
    assert proxy.issued_cert_ids() == {
        str(_renewal_info_path_component(leaf)): frozenset({"a.example.com"})
    }

    refused = _order(acme, "b.example.com")
    assert refused.status_code == 429
    assert re.fullmatch(
        rf'too many certificates \(1\) already issued for "example\.com" in the last 1h0m0s,'
        rf" retry after {STAMP}: see {re.escape(LIMITS_DOCS)}#new-certificates-per-registered-domain",
        refused.json()["detail"],
    ), refused.json()["detail"]
    assert 3600 * 0.999 <= int(refused.headers["Retry-After"]) <= math.ceil(3600 * 1.03)
    err = classify_acme_failure(messages.Error.from_json(refused.json()))
    assert (err.limit_scope, err.limit_name) == ("registered_domain", "CertificatesPerDomain")
    # Another registered domain is not held back.
    assert _order(acme, "c.example.net").status_code == 201
    assert proxy.limit_remaining(NEW_ORDERS_PER_ACCOUNT, account) == 1

    # The issued set again is a renewal: exempt from the per-domain and per-account limits.
    assert _order(acme, "a.example.com").status_code == 201
    assert _order(acme, "A.Example.COM").status_code == 201
    assert proxy.limit_remaining(NEW_ORDERS_PER_ACCOUNT, account) == 1
    renewal = proxy.limit_decisions()[-1]
    assert renewal.allowed and renewal.kind is OrderKind.RENEWAL
    assert {c.limit for c in renewal.checks} == set()  # only the limits that are off remain
    decisions = [(d.identifiers, d.kind, d.allowed, d.limit) for d in proxy.limit_decisions()]
    assert decisions == [
        (frozenset({"a.example.com"}), OrderKind.NEW, True, None),
        (frozenset({"b.example.com"}), OrderKind.NEW, False, CERTIFICATES_PER_DOMAIN),
        (frozenset({"c.example.net"}), OrderKind.NEW, True, None),
        (frozenset({"a.example.com"}), OrderKind.RENEWAL, True, None),
        (frozenset({"a.example.com"}), OrderKind.RENEWAL, True, None),
    ]


def test_limits_ari_renewal_is_exempt_from_every_limit(
    pebble: PebbleStack, proxy: FaultProxy
) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    proxy.serve_renewal_info(now + datetime.timedelta(hours=1), now + datetime.timedelta(hours=2))
    proxy.emulate_limits(
        LimitsConfig(new_orders=Bucket(1, period=3600.0), per_identifier_set=Bucket(1, period=3600.0))
    )
    acme = _acme(pebble, proxy.directory_url)
    host = "ari.example.com"
    leaf = _issue(acme, host)
    cert_id = str(_renewal_info_path_component(leaf))
    assert ari_cert_id(leaf) == cert_id

    # A renewal without replaces still counts against the exact-set limit.
    refused = _order(acme, host)
    assert refused.status_code == 429
    assert re.fullmatch(
        r"too many certificates \(1\) already issued for this exact set of identifiers in the last"
        rf" 1h0m0s, retry after {STAMP}: see {re.escape(LIMITS_DOCS)}"
        r"#new-certificates-per-exact-set-of-identifiers",
        refused.json()["detail"],
    )
    # replaces outside the ARI window the CA serves: no exemption either.
    assert _order(acme, host, replaces=cert_id).status_code == 429
    assert proxy.limit_decisions()[-1].kind is OrderKind.RENEWAL

    proxy.serve_renewal_info(now - datetime.timedelta(hours=1), now + datetime.timedelta(hours=1))
    answer = _order(acme, host, replaces=cert_id)
    assert answer.status_code == 201
    ari = proxy.limit_decisions()[-1]
    assert (ari.kind, ari.allowed, ari.checks, ari.replaces) == (
        OrderKind.ARI_RENEWAL, True, (), cert_id,
    )
    # A certificate the proxy never saw issued buys nothing.
    assert _order(acme, host, replaces="AAAA.AAAA").status_code == 429
    # New orders per account are exempt for the ARI renewal too (its token stayed spent).
    assert _order(acme, "other.example.com").status_code == 429
    assert proxy.limit_decisions()[-1].limit == NEW_ORDERS_PER_ACCOUNT
