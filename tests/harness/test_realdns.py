"""Knot + Unbound (devstack.realdns) give the DNS semantics the suites rely on.

Every query here goes to ``RealDns.resolver`` (Unbound, recursion desired), the
address certflow and Pebble are pointed at, unless it says Knot. Nothing is
skipped: missing binaries make the start-up raise StackError.
"""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.query
import dns.rcode
import dns.rdatatype
import dns.rdtypes.ANY.CAA
import dns.rrset
import josepy
import pytest
from acme import challenges, client, crypto_util, messages
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from josepy.jwk import JWKEC

from devstack import realdns, servers
from devstack.servers import PebbleStack, StackError
from devstack.realdns import RealDns

pytestmark = pytest.mark.e2e  # real binaries: out of the fast tier


@pytest.fixture(scope="module")
def real_dns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealDns]:
    with realdns.start_real_dns(tmp_path_factory.mktemp("realdns")) as server:
        yield server


@pytest.fixture(scope="module")
def pebble(real_dns: RealDns, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PebbleStack]:
    stack = servers.start_pebble(
        tmp_path_factory.mktemp("pebble-realdns"),
        nonce_reject_percent=0,
        dns_server=real_dns.resolver,
    )
    try:
        yield stack
    finally:
        stack.stop()


def _ask(address: str, name: str, rdtype: str) -> dns.message.Message:
    host, port = address.rsplit(":", 1)
    query = dns.message.make_query(name, rdtype)
    return dns.query.udp(query, host, port=int(port), timeout=3)


def _rrset(response: dns.message.Message, name: str, rdtype: str) -> dns.rrset.RRset | None:
    owner, kind = dns.name.from_text(name), dns.rdatatype.from_text(rdtype)
    for rrset in response.answer:
        if rrset.name == owner and rrset.rdtype == kind:
            return rrset
    return None


def _texts(response: dns.message.Message, name: str, rdtype: str) -> list[str]:
    rrset = _rrset(response, name, rdtype)
    return [] if rrset is None else sorted(rd.to_text() for rd in rrset)


def _soa_serial(address: str, zone: str = "test.") -> int:
    rrset = _rrset(_ask(address, zone, "SOA"), zone, "SOA")
    assert rrset is not None
    serial: int = rrset[0].serial
    return serial


# --------------------------------------------------------------------- semantics


def test_answers_come_from_unbound_recursing_to_knot(real_dns: RealDns) -> None:
    resolved = _ask(real_dns.resolver, "test.", "SOA")
    assert resolved.rcode() == dns.rcode.NOERROR
    assert resolved.flags & dns.flags.RA  # a recursive resolver answered...
    assert not resolved.flags & dns.flags.AA  # ...not the authoritative server
    direct = _ask(real_dns.authoritative, "test.", "SOA")
    assert direct.flags & dns.flags.AA
    assert _texts(resolved, "test.", "SOA") == _texts(direct, "test.", "SOA")
    assert real_dns.resolver != real_dns.authoritative


def test_caa_query_follows_the_cname(real_dns: RealDns) -> None:
    with real_dns.batch():
        real_dns.set_caa("edge.saas.test", [(0, "issue", "digicert.com")])
        real_dns.set_cname("shop.cust.test", "edge.saas.test")

    response = _ask(real_dns.resolver, "shop.cust.test", "CAA")
    assert response.rcode() == dns.rcode.NOERROR
    assert _texts(response, "shop.cust.test.", "CNAME") == ["edge.saas.test."]
    assert _texts(response, "edge.saas.test.", "CAA") == ['0 issue "digicert.com"']
    # The alias itself holds no CAA: the policy is the target's.
    assert _rrset(response, "shop.cust.test.", "CAA") is None


def test_caa_change_is_visible_on_the_next_query(real_dns: RealDns) -> None:
    # A long TTL: without the cache flush Unbound would keep the old answer for minutes.
    real_dns.set_caa("flip.cust.test", [(0, "issue", "digicert.com")], ttl=600)
    first = _ask(real_dns.resolver, "flip.cust.test", "CAA")
    assert _texts(first, "flip.cust.test.", "CAA") == ['0 issue "digicert.com"']
    rrset = _rrset(first, "flip.cust.test.", "CAA")
    assert rrset is not None and 1 < rrset.ttl <= 600

    real_dns.set_caa("flip.cust.test", [(0, "issue", "letsencrypt.org")], ttl=600)
    second = _ask(real_dns.resolver, "flip.cust.test", "CAA")
    assert _texts(second, "flip.cust.test.", "CAA") == ['0 issue "letsencrypt.org"']


def test_cname_retarget_is_visible_through_the_alias(real_dns: RealDns) -> None:
    with real_dns.batch():
        real_dns.set_caa("old-edge.saas", [(0, "issue", "digicert.com")], ttl=600)
        real_dns.set_caa("new-edge.saas", [(0, "issue", "letsencrypt.org")], ttl=600)
        real_dns.set_cname("moving.cust", "old-edge.saas", ttl=600)
    assert _texts(_ask(real_dns.resolver, "moving.cust.test", "CAA"), "old-edge.saas.test.", "CAA")

    real_dns.set_cname("moving.cust", "new-edge.saas", ttl=600)
    response = _ask(real_dns.resolver, "moving.cust.test", "CAA")
    assert _texts(response, "moving.cust.test.", "CNAME") == ["new-edge.saas.test."]
    assert _texts(response, "new-edge.saas.test.", "CAA") == ['0 issue "letsencrypt.org"']
    assert _rrset(response, "old-edge.saas.test.", "CAA") is None


def test_clear_gives_nxdomain(real_dns: RealDns) -> None:
    with real_dns.batch():
        real_dns.set_a("gone.cust.test", ["127.0.0.9"], ttl=600)
        real_dns.set_caa("gone.cust.test", [(0, "issue", "digicert.com")], ttl=600)
    assert _texts(_ask(real_dns.resolver, "gone.cust.test", "A"), "gone.cust.test.", "A") == [
        "127.0.0.9"
    ]

    real_dns.clear("gone.cust.test")
    for rdtype in ("A", "CAA"):
        response = _ask(real_dns.resolver, "gone.cust.test", rdtype)
        assert response.rcode() == dns.rcode.NXDOMAIN
        assert response.answer == []


def test_removed_type_gives_nodata_with_a_short_negative_ttl(real_dns: RealDns) -> None:
    with real_dns.batch():
        real_dns.set_a("nodata.cust.test", ["127.0.0.9"])
        real_dns.set_caa("nodata.cust.test", [(0, "issue", "digicert.com")], ttl=600)
    real_dns.set_caa("nodata.cust.test", [])

    response = _ask(real_dns.resolver, "nodata.cust.test", "CAA")
    assert response.rcode() == dns.rcode.NOERROR
    assert response.answer == []
    [soa] = [r for r in response.authority if r.rdtype == dns.rdatatype.SOA]
    assert soa.ttl <= realdns.RECORD_TTL
    # The name still exists with its other record.
    assert _texts(_ask(real_dns.resolver, "nodata.cust.test", "A"), "nodata.cust.test.", "A")


def test_one_type_can_servfail_while_the_others_answer(tmp_path: Path) -> None:
    """Unbound's policy module answers SERVFAIL for the listed name and type only;
    cleared, the record Knot serves comes back."""
    with realdns.start_real_dns(tmp_path / "dns", failures=True) as dns_:
        with dns_.batch():
            dns_.set_a("half.cust.test", ["127.0.0.9"])
            dns_.set_aaaa("half.cust.test", ["::1"])
        dns_.fail_lookups("half.cust.test", ["AAAA"])
        assert _ask(dns_.resolver, "half.cust.test", "AAAA").rcode() == dns.rcode.SERVFAIL
        assert _texts(_ask(dns_.resolver, "half.cust.test", "A"), "half.cust.test.", "A") == ["127.0.0.9"]
        dns_.fail_lookups("half.cust.test", [])
        assert _texts(_ask(dns_.resolver, "half.cust.test", "AAAA"), "half.cust.test.", "AAAA") == ["::1"]
    with realdns.start_real_dns(tmp_path / "plain") as plain, pytest.raises(StackError, match="failures=True"):
        plain.fail_lookups("half.cust.test", ["AAAA"])


def test_a_record_at_another_loopback_address(real_dns: RealDns) -> None:
    real_dns.set_a("www.cust", ["127.0.0.9"])
    response = _ask(real_dns.resolver, "www.cust.test", "A")
    assert _texts(response, "www.cust.test.", "A") == ["127.0.0.9"]
    rrset = _rrset(response, "www.cust.test.", "A")
    assert rrset is not None and rrset.ttl <= realdns.RECORD_TTL
    assert _ask(real_dns.resolver, "www.cust.test", "AAAA").answer == []

    real_dns.set_aaaa("www.cust", ["::1"])
    assert _texts(_ask(real_dns.resolver, "www.cust.test", "AAAA"), "www.cust.test.", "AAAA") == [
        "::1"
    ]


@pytest.mark.parametrize(
    ("flags", "tag", "value"),
    [
        (0, "issue", "letsencrypt.org; validationmethods=dns-01"),
        (0, "issue", "ca.test; accounturi=https://ca.test/acct/1; validationmethods=http-01"),
        (128, "issuewild", ";"),
        (0, "iodef", "mailto:ops@cust.test"),
        (0, "issue", 'odd "quoted" \\back\\slash  two  spaces\ttab'),
    ],
)
def test_caa_value_round_trips_exactly(
    real_dns: RealDns, flags: int, tag: str, value: str
) -> None:
    real_dns.set_caa("params.cust.test", [(flags, tag, value)])
    rrset = _rrset(_ask(real_dns.resolver, "params.cust.test", "CAA"), "params.cust.test.", "CAA")
    assert rrset is not None
    [rdata] = list(rrset)
    assert isinstance(rdata, dns.rdtypes.ANY.CAA.CAA)
    assert (rdata.flags, rdata.tag, rdata.value) == (flags, tag.encode(), value.encode())


def test_cname_and_other_data_replace_each_other(real_dns: RealDns) -> None:
    real_dns.set_a("both.cust", ["127.0.0.9"])
    real_dns.set_cname("both.cust", "www.cust")
    response = _ask(real_dns.resolver, "both.cust.test", "CNAME")
    assert _texts(response, "both.cust.test.", "CNAME") == ["www.cust.test."]
    assert _rrset(_ask(real_dns.resolver, "both.cust.test", "A"), "both.cust.test.", "A") is None

    real_dns.set_caa("both.cust", [(0, "issue", "digicert.com")])
    assert _ask(real_dns.resolver, "both.cust.test", "CNAME").answer == []
    assert _texts(_ask(real_dns.resolver, "both.cust.test", "CAA"), "both.cust.test.", "CAA")


def test_batch_sets_many_names_with_one_reload(real_dns: RealDns) -> None:
    before = _soa_serial(real_dns.authoritative)
    with real_dns.batch():
        for i in range(40):
            real_dns.set_a(f"bulk{i}.cust", [f"127.0.1.{i + 1}"])
        # Untouched by the reload until the block ends.
        assert _soa_serial(real_dns.authoritative) == before
    assert _soa_serial(real_dns.authoritative) == before + 1
    for i in range(40):
        response = _ask(real_dns.resolver, f"bulk{i}.cust.test", "A")
        assert _texts(response, f"bulk{i}.cust.test.", "A") == [f"127.0.1.{i + 1}"]


def test_failed_batch_changes_nothing(real_dns: RealDns) -> None:
    before = _soa_serial(real_dns.authoritative)
    with pytest.raises(RuntimeError), real_dns.batch():
        real_dns.set_a("never.cust", ["127.0.0.9"])
        raise RuntimeError("abandon")
    assert _soa_serial(real_dns.authoritative) == before
    assert _ask(real_dns.resolver, "never.cust.test", "A").rcode() == dns.rcode.NXDOMAIN
    real_dns.set_a("after-abandon.cust", ["127.0.0.9"])  # still usable
    assert _ask(real_dns.resolver, "never.cust.test", "A").rcode() == dns.rcode.NXDOMAIN


def test_name_forms_and_names_outside_the_zone(real_dns: RealDns) -> None:
    for form in ("forms.cust", "forms.cust.test", "forms.cust.test.", "FORMS.Cust.Test"):
        address = f"127.0.2.{len(form)}"
        real_dns.set_a(form, [address])
        response = _ask(real_dns.resolver, "forms.cust.test", "A")
        assert _texts(response, "forms.cust.test.", "A") == [address]
    real_dns.set_caa("@", [(0, "issue", "apex.example")])
    assert _texts(_ask(real_dns.resolver, "test.", "CAA"), "test.", "CAA") == [
        '0 issue "apex.example"'
    ]
    with pytest.raises(ValueError, match="not inside the zone"):
        real_dns.set_a("shop.example.com.", ["127.0.0.9"])
    with pytest.raises(ValueError):
        real_dns.set_cname("@", "edge.saas")
    with pytest.raises(ValueError):
        real_dns.set_caa("x.cust", [(0, "not a tag", "x")])
    with pytest.raises(ValueError):
        real_dns.set_a("x.cust", ["::1"])


def test_generic_records(real_dns: RealDns) -> None:
    real_dns.set_records("_acme-challenge.txt.cust", "TXT", ['"token with spaces"'])
    response = _ask(real_dns.resolver, "_acme-challenge.txt.cust.test", "TXT")
    assert _texts(response, "_acme-challenge.txt.cust.test.", "TXT") == ['"token with spaces"']


def test_stop_takes_both_servers_down(tmp_path: Path) -> None:
    with realdns.start_real_dns(tmp_path, zone="cust.test") as server:
        server.set_a("www", ["127.0.0.9"])
        answer = _ask(server.resolver, "www.cust.test", "A")
        assert _texts(answer, "www.cust.test.", "A") == ["127.0.0.9"]
        addresses = (server.resolver, server.authoritative)
    server.stop()  # idempotent
    for address in addresses:
        host, port = address.rsplit(":", 1)
        with pytest.raises((dns.exception.Timeout, OSError)):
            query = dns.message.make_query("cust.test.", "SOA")
            dns.query.tcp(query, host, port=int(port), timeout=1)
    with pytest.raises(StackError):
        server.set_a("www", ["127.0.0.10"])


def test_missing_binary_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(StackError, match="scripts/setup.sh"):
        realdns.start_real_dns(tmp_path)


# ------------------------------------------------------------------------ pebble


def test_pebble_uses_the_real_resolver(pebble: PebbleStack, real_dns: RealDns) -> None:
    context = ssl.create_default_context(cafile=str(pebble.ca_bundle))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    with opener.open(pebble.directory_url, timeout=5) as resp:
        directory = json.load(resp)
    assert "newOrder" in directory
    # certflow_environment hands this to the worker as CERTFLOW_DNS_RESOLVER.
    assert pebble.dns_resolver == real_dns.resolver
    assert pebble.challtestsrv_url == ""
    with pytest.raises(StackError, match="RealDns"):
        pebble.set_cname("shop.cust.test", "edge.saas.test")
    with pytest.raises(StackError, match="RealDns"):
        pebble.add_caa("shop.cust.test", [("issue", "x")])


class _Http01(http.server.BaseHTTPRequestHandler):
    answers: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.answers.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_pebble_validates_http01_at_the_address_knot_serves(
    pebble: PebbleStack, real_dns: RealDns
) -> None:
    # Only 127.0.0.9 answers the challenge, so a valid authorization proves
    # Pebble's VA resolved the name through Unbound to Knot's A record.
    host = "http01.cust.test"
    real_dns.set_a(host, ["127.0.0.9"])
    server = http.server.ThreadingHTTPServer(("127.0.0.9", pebble.http01_port), _Http01)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        key = JWKEC(key=ec.generate_private_key(ec.SECP256R1()))
        verify: Any = str(pebble.ca_bundle)  # acme types it bool; requests takes a path
        net = client.ClientNetwork(key, alg=josepy.jwa.ES256, verify_ssl=verify)
        acme = client.ClientV2(client.ClientV2.get_directory(pebble.directory_url, net), net)
        net.account = acme.new_account(
            messages.NewRegistration.from_data(terms_of_service_agreed=True)
        )
        cert_key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        order = acme.new_order(crypto_util.make_csr(cert_key, [host]))
        [authz] = order.authorizations
        challb = next(c for c in authz.body.challenges if isinstance(c.chall, challenges.HTTP01))
        assert isinstance(challb.chall, challenges.HTTP01)
        response, validation = challb.chall.response_and_validation(key)
        _Http01.answers[challb.chall.path] = validation.encode()
        acme.answer_challenge(challb, response)

        deadline = time.monotonic() + 30
        while True:
            authz, _ = acme.poll(authz)
            if authz.body.status != messages.STATUS_PENDING or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert authz.body.status == messages.STATUS_VALID, authz.body.challenges
    finally:
        server.shutdown()
        server.server_close()
        _Http01.answers.clear()
