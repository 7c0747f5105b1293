"""acme2certifier (devstack.acme2certifier) validates dns-persist-01 against real DNS.

Driven by the plain ``acme`` client, as certflow drives a CA: the TXT record at
``_validation-persist.<host>`` is served by Knot through Unbound
(devstack.realdns), which acme2certifier asks on port 53 of a loopback address.
Nothing is skipped: a missing .venv-a2c or DNS binary makes start-up raise.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import josepy
import pytest
from acme import challenges, client, crypto_util, messages
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import PolicyBuilder, Store
from josepy.jwk import JWKEC

from devstack import realdns
from devstack.acme2certifier import Acme2CertifierStack, start_acme2certifier
from devstack.realdns import RealDns

pytestmark = pytest.mark.e2e  # real binaries: out of the fast tier

# Unbound's port-53 address for acme2certifier; no other suite uses 127.0.3.0/24.
RESOLVER_HOST = "127.0.3.53"
DNS_PERSIST_01 = "dns-persist-01"


class DnsPersist01Response(challenges.ChallengeResponse):
    """The draft's answer to dns-persist-01: an empty JSON object (the record is the proof)."""

    typ = DNS_PERSIST_01


@pytest.fixture(scope="module")
def real_dns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealDns]:
    workdir = tmp_path_factory.mktemp("a2c-realdns")
    with realdns.start_real_dns(workdir, resolver_host=RESOLVER_HOST) as server:
        yield server


@pytest.fixture(scope="module")
def a2c(
    real_dns: RealDns, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Acme2CertifierStack]:
    stack = start_acme2certifier(tmp_path_factory.mktemp("a2c"), resolver_ip=real_dns.resolver_ip)
    try:
        yield stack
    finally:
        stack.stop()


@dataclass(frozen=True)
class Account:
    """A registered ACME account and its URL (what a dns-persist-01 record names)."""

    acme: client.ClientV2
    url: str


def _account(a2c: Acme2CertifierStack) -> Account:
    key = JWKEC(key=ec.generate_private_key(ec.SECP256R1()))
    # acme types verify_ssl as bool, but requests takes a CA bundle path there.
    verify: Any = str(a2c.ca_bundle)
    net = client.ClientNetwork(key, alg=josepy.jwa.ES256, verify_ssl=verify)
    acme = client.ClientV2(client.ClientV2.get_directory(a2c.directory_url, net), net)
    regr = acme.new_account(messages.NewRegistration.from_data(terms_of_service_agreed=True))
    return Account(acme, str(regr.uri))


def _unique_host() -> str:
    return f"shop.{uuid.uuid4().hex[:10]}.test"


def _publish(real_dns: RealDns, host: str, value: str) -> None:
    # Presentation format: one quoted character-string (a2c reads only the first).
    real_dns.set_records(f"_validation-persist.{host.removeprefix('*.')}", "TXT", [f'"{value}"'])


def _order(account: Account, names: list[str]) -> messages.OrderResource:
    key_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return account.acme.new_order(crypto_util.make_csr(key_pem, names))


def _challenge_type(challb: messages.ChallengeBody) -> str:
    # acme parses dns-persist-01 as an UnrecognizedChallenge: read its JSON.
    return str(challb.to_partial_json()["type"])


def _answer_dns_persist(
    account: Account, order: messages.OrderResource, a2c: Acme2CertifierStack
) -> messages.ChallengeResource:
    [authz] = order.authorizations
    offered = {_challenge_type(c): c for c in authz.body.challenges}
    challb = offered[DNS_PERSIST_01]
    # The challenge names what the record must say.
    body = challb.to_partial_json()
    assert body["accounturi"] == account.url
    assert body["issuer-domain-names"] == [a2c.issuer_domain]
    assert "token" not in body
    return account.acme.answer_challenge(challb, DnsPersist01Response())


def _deadline() -> datetime.datetime:
    return datetime.datetime.now() + datetime.timedelta(seconds=60)


def _assert_refused(
    account: Account, order: messages.OrderResource, a2c: Acme2CertifierStack
) -> None:
    """The answer fails validation: challenge and authorization end up invalid."""
    # a2c validates before it answers the POST (up to 10 s), so the result is in.
    challr = _answer_dns_persist(account, order, a2c)
    assert challr.body.status == messages.STATUS_INVALID
    [authz] = order.authorizations
    authzr, _ = account.acme.poll(authz)
    assert authzr.body.status == messages.STATUS_INVALID
    [challb] = [c for c in authzr.body.challenges if _challenge_type(c) == DNS_PERSIST_01]
    assert challb.status == messages.STATUS_INVALID
    # a2c 0.46.3 quirks a client must live with: the failed challenge carries no
    # "error" (its SQLite DB handler never stores it), and the order stays
    # "pending" rather than turning "invalid" (RFC 8555 7.1.6). So fail on the
    # authorization's status; polling the order would only time out.
    assert challr.body.error is None and challb.error is None
    order_json = account.acme._post_as_get(order.uri).json()
    assert order_json["status"] == messages.STATUS_PENDING.name


def _verify(fullchain_pem: str, a2c: Acme2CertifierStack, name: str) -> x509.Certificate:
    leaf, *intermediates = x509.load_pem_x509_certificates(fullchain_pem.encode())
    roots = x509.load_pem_x509_certificates(a2c.root_pem.read_bytes())
    verifier = PolicyBuilder().store(Store(roots)).build_server_verifier(x509.DNSName(name))
    chain = verifier.verify(leaf, intermediates)
    assert chain[-1] == roots[0]
    return leaf


def _sans(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


def test_dns_persist_01_issues(a2c: Acme2CertifierStack, real_dns: RealDns) -> None:
    account = _account(a2c)
    host = _unique_host()
    _publish(real_dns, host, f"{a2c.issuer_domain}; accounturi={account.url}")

    order = _order(account, [host])
    [authz] = order.authorizations
    assert authz.body.identifier.value == host
    offered = {_challenge_type(c) for c in authz.body.challenges}
    assert offered == {"http-01", "dns-01", DNS_PERSIST_01}

    _answer_dns_persist(account, order, a2c)
    done = account.acme.poll_and_finalize(order, _deadline())
    assert done.body.status == messages.STATUS_VALID
    assert done.fullchain_pem
    leaf = _verify(done.fullchain_pem, a2c, host)
    assert _sans(leaf) == [host]


def test_dns_persist_01_record_for_another_account_is_refused(
    a2c: Acme2CertifierStack, real_dns: RealDns
) -> None:
    account, other = _account(a2c), _account(a2c)
    assert account.url != other.url
    host = _unique_host()
    _publish(real_dns, host, f"{a2c.issuer_domain}; accounturi={other.url}")

    order = _order(account, [host])
    _assert_refused(account, order, a2c)


def test_dns_persist_01_wildcard_with_policy_issues(
    a2c: Acme2CertifierStack, real_dns: RealDns
) -> None:
    account = _account(a2c)
    host = _unique_host()
    persist_until = int(datetime.datetime.now().timestamp()) + 3600
    _publish(
        real_dns,
        host,
        f"{a2c.issuer_domain}; accounturi={account.url}; policy=wildcard;"
        f" persistUntil={persist_until}",
    )

    order = _order(account, [f"*.{host}"])
    [authz] = order.authorizations
    assert authz.body.wildcard is True
    # RFC 8555: a wildcard is never proven over HTTP.
    assert {_challenge_type(c) for c in authz.body.challenges} == {"dns-01", DNS_PERSIST_01}

    _answer_dns_persist(account, order, a2c)
    done = account.acme.poll_and_finalize(order, _deadline())
    assert done.fullchain_pem
    leaf = _verify(done.fullchain_pem, a2c, f"www.{host}")
    assert _sans(leaf) == [f"*.{host}"]


def test_dns_persist_01_wildcard_without_policy_is_refused(
    a2c: Acme2CertifierStack, real_dns: RealDns
) -> None:
    account = _account(a2c)
    host = _unique_host()
    _publish(real_dns, host, f"{a2c.issuer_domain}; accounturi={account.url}")

    order = _order(account, [f"*.{host}"])
    _assert_refused(account, order, a2c)
