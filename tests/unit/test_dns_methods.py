"""The pure parts of validation over DNS: the delegation label and TXT value of
dns-01, the persist record as the draft says the CA judges it, and which method
``auto`` picks (lookups faked; the real ones are in tests/e2e/test_dns_validation.py
and tests/e2e/test_dns_persist.py)."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone

from josepy.jwk import JWKEC
import pytest
from acme import challenges
from cryptography.hazmat.primitives.asymmetric import ec

from certflow.dns.tsig import TsigKey
from certflow.dns import dns01
from certflow.dns.caa_records import CaaAnswer, CaaAnswerSet, CaaRecord
from certflow.dns.caa_verdict import CaaIssuer
from certflow.dns.checks import DnsChecker
from certflow.dns.lookup import CnameAnswer
from certflow.dns.persist import judge, persist_record
from certflow.errors import DnsCheckError, ErrorCode
from certflow.models import RequestedMethod, ValidationMethod

ACCOUNT = "https://ca.example/acct/42"
NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)
KEY = TsigKey("k", "hmac-sha256", b"x" * 32)
ZONE = dns01.Dns01Zone(zone="acme.saas.test", primary="127.0.0.1:53", key=KEY)


def test_the_txt_value_is_the_one_the_acme_library_computes() -> None:
    """RFC 8555 §8.4, checked against certbot's implementation, not ours."""
    account_key = JWKEC(key=ec.generate_private_key(ec.SECP256R1()))
    challenge = challenges.DNS01(token=b"tok" * 11)
    key_authorization = challenge.key_authorization(account_key)
    assert dns01.txt_value(key_authorization) == challenge.validation(account_key)


def test_the_label_is_stable_short_and_shared_by_a_wildcard() -> None:
    label = dns01.delegation_label("shop.customer.com")
    assert label == dns01.delegation_label("shop.customer.com")
    assert len(label) == 24 and label.isalnum() and label == label.lower()
    assert dns01.delegation_label("*.shop.customer.com") == label
    assert dns01.delegation_label("other.customer.com") != label
    assert ZONE.delegation("*.shop.customer.com").model_dump() == {
        "name": "_acme-challenge.shop.customer.com",
        "type": "CNAME",
        "value": f"{label}.acme.saas.test",
    }


@pytest.mark.parametrize(
    "text",
    ["k", "k:hmac-md5:" + base64.b64encode(b"x" * 32).decode(), "k:hmac-sha256:not base64!", "k:hmac-sha256:c2hvcnQ="],
)
def test_a_bad_tsig_key_is_refused_without_quoting_the_secret(text: str) -> None:
    with pytest.raises(ValueError) as raised:
        TsigKey.parse(text)
    assert "c2hvcnQ" not in str(raised.value) and "x" * 8 not in str(raised.value)
    assert "s3cr3t" not in repr(TsigKey("k", "hmac-sha256", b"s3cr3t" * 4))


@pytest.mark.parametrize(
    ("records", "host", "verdict"),
    [
        ([f"ca.example; accounturi={ACCOUNT}"], "shop.test", None),
        ([f"CA.Example; accounturi={ACCOUNT}"], "shop.test", None),  # lower-cased, as the draft says
        ([f"ca.example; accounturi={ACCOUNT}; future=1"], "shop.test", None),  # unknown: ignored
        ([f"other.example; accounturi={ACCOUNT}"], "shop.test", "no record for ca.example"),
        (["ca.example; accounturi=https://ca.example/acct/7"], "shop.test", "names another account"),
        (["ca.example"], "shop.test", "has no accounturi"),
        ([f"ca.example; accounturi={ACCOUNT}; accounturi={ACCOUNT}"], "shop.test", "repeats a parameter"),
        ([f"ca.example; accounturi={ACCOUNT}; persistUntil=1"], "shop.test", "expired at 1970"),
        ([f"ca.example; accounturi={ACCOUNT}; persistUntil=soon"], "shop.test", "not a UNIX time"),
        ([f"ca.example; accounturi={ACCOUNT}"], "*.shop.test", "lacks policy=wildcard"),
        ([f"ca.example; accounturi={ACCOUNT}; policy=Wildcard"], "*.shop.test", None),
        # No ";": the issuer is "ca.example accounturi", no domain name, and the CA
        # skips the record (Boulder va/dns_persist.go parseDNSPersistRecord).
        (["ca.example accounturi"], "shop.test", "no record for ca.example (skipped, as the CA skips them"),
        # One good record among others is enough, as for the CA.
        (["other.example; x=1", f"ca.example; accounturi={ACCOUNT}"], "shop.test", None),
        ([], "shop.test", "no record for ca.example"),
    ],
)
def test_a_persist_record_is_judged_as_the_draft_says(
    records: list[str], host: str, verdict: str | None
) -> None:
    found = judge(records, host, ["ca.example"], ACCOUNT, NOW)
    if verdict is None:
        assert found is None
    else:
        assert found is not None and verdict in found, found


def test_persist_until_in_the_future_is_fine() -> None:
    later = int((NOW + timedelta(days=1)).timestamp())
    assert judge([f"ca.example; accounturi={ACCOUNT}; persistUntil={later}"], "a.test", ["ca.example"], ACCOUNT, NOW) is None


def test_the_persist_record_to_publish() -> None:
    assert persist_record("*.shop.test", "ca.example", ACCOUNT).model_dump() == {
        "name": "_validation-persist.shop.test",
        "type": "TXT",
        "value": f"ca.example; accounturi={ACCOUNT}; policy=wildcard",
    }


class _Dns:
    """Fake lookups: CNAMEs and TXTs by name; no CAA anywhere."""

    def __init__(self, cnames: dict[str, str], txts: dict[str, list[str]]) -> None:
        self.cnames, self.txts = cnames, txts

    async def cname(self, name: str) -> list[CnameAnswer]:
        return [CnameAnswer(name, self.cnames[name])] if name in self.cnames else []

    async def txt(self, name: str) -> list[str]:
        return self.txts.get(name, [])

    async def caa(self, name: str) -> CaaAnswerSet:
        return CaaAnswerSet(cnames=[], caa=[])


def _checker(fake: _Dns, *, dns01_zone: dns01.Dns01Zone | None = ZONE, persist: bool = True) -> DnsChecker:
    checker = DnsChecker(
        "127.0.0.1:53",
        "edge.saas.test",
        "ca.example",
        issuers=(("ca", CaaIssuer(("ca.example",), ACCOUNT)),),
        dns01=dns01_zone,
        persist_issuers=frozenset({"ca"} if persist else set()),
    )
    object.__setattr__(checker, "lookup_cname", fake.cname)
    object.__setattr__(checker, "lookup_txt", fake.txt)
    object.__setattr__(checker, "lookup_caa", fake.caa)
    return checker


@pytest.fixture(autouse=True)
def _no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signed no-op update is the real primary's business (tested on Knot)."""

    async def accepted(zone: dns01.Dns01Zone) -> None:
        return None

    monkeypatch.setattr("certflow.dns.checks.probe", accepted)


async def test_auto_prefers_persist_then_the_delegation_then_the_edge() -> None:
    host = "shop.test"
    delegation = {f"_acme-challenge.{host}": ZONE.target(host)}
    edge = {host: "edge.saas.test"}
    persist = {f"_validation-persist.{host}": [f"ca.example; accounturi={ACCOUNT}"]}
    everything = await _checker(_Dns(delegation | edge, persist)).check(host)
    assert everything.methods == [ValidationMethod.DNS_PERSIST_01, ValidationMethod.DNS_01, ValidationMethod.HTTP_01]
    routed = await _checker(_Dns(edge, {})).check(host)
    assert routed.methods == [ValidationMethod.HTTP_01]
    delegated = await _checker(_Dns(delegation, {})).check(host)
    assert delegated.methods == [ValidationMethod.DNS_01] and "delegated" in (delegated.method_reason or "")


async def test_auto_with_nothing_ready_keeps_the_routing_code_and_names_the_rest() -> None:
    with pytest.raises(DnsCheckError) as raised:
        await _checker(_Dns({}, {})).check("shop.test")
    assert raised.value.code is ErrorCode.DNS_CNAME
    assert "has no CNAME record; expected a CNAME to edge.saas.test" in raised.value.message
    assert "before the traffic moves: dns-persist-01:" in raised.value.message
    assert f"add _acme-challenge.shop.test CNAME {ZONE.target('shop.test')}" in raised.value.message


async def test_without_dns_methods_set_up_the_message_is_as_before() -> None:
    with pytest.raises(DnsCheckError) as raised:
        await _checker(_Dns({}, {}), dns01_zone=None, persist=False).check("shop.test")
    assert raised.value.code is ErrorCode.DNS_CNAME
    assert raised.value.message == "shop.test has no CNAME record; expected a CNAME to edge.saas.test"


async def test_a_wildcard_is_never_http01() -> None:
    host = "*.shop.test"
    edge = {host[2:]: "edge.saas.test"}
    with pytest.raises(DnsCheckError) as raised:
        await _checker(_Dns(edge, {})).check(host)
    assert raised.value.code is ErrorCode.DNS_PERSIST  # the first DNS method's, with both named
    assert "dns-01:" in raised.value.message and "http-01" not in raised.value.message.split(";")[0]
    with pytest.raises(DnsCheckError) as explicit:
        await _checker(_Dns(edge, {})).check(host, RequestedMethod.HTTP_01)
    assert "a CA validates it over DNS only" in explicit.value.message


async def test_an_explicit_method_is_the_only_one_tried() -> None:
    host = "shop.test"
    with pytest.raises(DnsCheckError) as raised:
        await _checker(_Dns({host: "edge.saas.test"}, {})).check(host, RequestedMethod.DNS_01)
    assert raised.value.code is ErrorCode.DNS_DELEGATION


class _DnsWithCaa(_Dns):
    """The fake lookups, with one CAA set at the hostname."""

    def __init__(self, cnames: dict[str, str], txts: dict[str, list[str]], caa: dict[str, list[str]]) -> None:
        super().__init__(cnames, txts)
        self.caa_values = caa

    async def caa(self, name: str) -> CaaAnswerSet:
        values = self.caa_values.get(name, [])
        return CaaAnswerSet(cnames=[], caa=[CaaAnswer(name, CaaRecord(0, "issue", v)) for v in values])


@pytest.mark.parametrize(
    ("allowed", "handed_on"),
    [
        ("dns-persist-01", [ValidationMethod.DNS_PERSIST_01]),
        ("dns-persist-01,dns-01", [ValidationMethod.DNS_PERSIST_01, ValidationMethod.DNS_01]),
        ("http-01,dns-persist-01", [ValidationMethod.DNS_PERSIST_01, ValidationMethod.HTTP_01]),
    ],
)
async def test_a_fallback_method_is_handed_on_only_when_caa_allows_it(
    allowed: str, handed_on: list[ValidationMethod]
) -> None:
    """Boulder judges CAA (RFC 8657 ``validationmethods``) for the challenge that
    validates (va/caa.go checkCAA, caaValidationMethodMatches): a method an order
    may fall back to, when the CA offers no challenge of the first, must be
    allowed too. Red with every later ready method handed on (the first case
    got dns-01 and http-01 as fallbacks, which Boulder would refuse; checked once)."""
    host = "shop.test"
    delegation = {f"_acme-challenge.{host}": ZONE.target(host)}
    edge = {host: "edge.saas.test"}
    persist = {f"_validation-persist.{host}": [f"ca.example; accounturi={ACCOUNT}"]}
    caa = {host: [f"ca.example; validationmethods={allowed}"]}
    verdict = await _checker(_DnsWithCaa(delegation | edge, persist, caa)).check(host)
    assert verdict.methods == handed_on


async def test_check_shows_caas_verdict_for_each_method() -> None:
    """``starter.py check`` and ``status`` show CAA per method, not for http-01
    alone: with ``validationmethods=dns-01`` the edge's route is ready but CAA
    refuses it, and dns-01 is both ready and allowed. Red with every method judged
    as http-01 (checked once: dns-01 shown as refused)."""
    host = "shop.test"
    delegation = {f"_acme-challenge.{host}": ZONE.target(host)}
    edge = {host: "edge.saas.test"}
    caa = {host: ["ca.example; validationmethods=dns-01"]}
    found = {m.method: m for m in await _checker(_DnsWithCaa(delegation | edge, {}, caa)).readiness(host)}
    assert found[ValidationMethod.HTTP_01].ready and found[ValidationMethod.HTTP_01].caa_allowed is False
    assert "validationmethods=dns-01" in (found[ValidationMethod.HTTP_01].caa or "")
    assert found[ValidationMethod.DNS_01].ready and found[ValidationMethod.DNS_01].caa_allowed is True
    assert (found[ValidationMethod.DNS_01].caa or "").endswith("(ca)")


async def test_a_persist_record_for_a_ca_caa_refuses_falls_through_to_the_next_method() -> None:
    """Two CAs, the customer's persist record names the one CAA does not allow:
    Boulder would refuse that CA on CAA, so certflow tries the next ready method
    (dns-01, with the CA CAA allows) instead of stopping on DNS_PERSIST. Red with
    the refusal raised at once (checked once)."""
    host = "shop.test"
    checker = DnsChecker(
        "127.0.0.1:53",
        "edge.saas.test",
        "ca.example",
        issuers=(("ca", CaaIssuer(("ca.example",), ACCOUNT)), ("other", CaaIssuer(("other.example",), ACCOUNT))),
        dns01=ZONE,
        persist_issuers=frozenset({"ca"}),
    )
    fake = _DnsWithCaa(
        {f"_acme-challenge.{host}": ZONE.target(host)},
        {f"_validation-persist.{host}": [f"ca.example; accounturi={ACCOUNT}"]},
        {host: ["other.example"]},
    )
    object.__setattr__(checker, "lookup_cname", fake.cname)
    object.__setattr__(checker, "lookup_txt", fake.txt)
    object.__setattr__(checker, "lookup_caa", fake.caa)
    verdict = await checker.check(host)
    assert verdict.methods == [ValidationMethod.DNS_01]
    assert verdict.allowed_issuers == ["other"]


async def test_a_cname_chain_to_our_label_is_a_delegation() -> None:
    """``_acme-challenge.<host>`` CNAME to a name of the customer's provider, which
    aliases our label: the CA's recursive resolver follows the chain (Boulder's VA
    asks for the TXT and takes what Unbound answers through the aliases), so the
    delegation is ready. A chain ending elsewhere is still DNS_DELEGATION. Red
    with the chain not followed (checked once: DNS_DELEGATION for the chain)."""
    host = "shop.test"
    chained = {f"_acme-challenge.{host}": "acme.provider.test", "acme.provider.test": ZONE.target(host)}
    verdict = await dns01.check_delegation(host, ZONE, _Dns(chained, {}).cname)
    assert "through acme.provider.test" in verdict
    elsewhere = {f"_acme-challenge.{host}": "acme.provider.test", "acme.provider.test": "other.example.test"}
    with pytest.raises(DnsCheckError) as raised:
        await dns01.check_delegation(host, ZONE, _Dns(elsewhere, {}).cname)
    assert raised.value.code is ErrorCode.DNS_DELEGATION
