"""Choosing the CA per hostname: CAA × issuers × fallbacks (pure functions), and
the External Account Binding JWS (RFC 8555 §7.3.4)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from acme import messages
from cryptography.hazmat.primitives.asymmetric import ec
from josepy.b64 import b64decode
from josepy.jwk import JWKEC
from pydantic import SecretStr

from certflow.acme.account import external_account_binding
from certflow.dns.caa_records import CaaAnswer, CaaAnswerSet, CaaRecord
from certflow.dns.caa_verdict import CaaIssuer, allowed_issuers
from certflow.dns.lookup import CnameAnswer
from certflow.dns.checks import DnsChecker
from certflow.errors import DnsCheckError, ErrorCode
from certflow.issuers import ExternalAccountBinding
from certflow.models import CertificateStatus
from workflows.policy import choose_issuer, fallback_issuers, fallback_outcome, issuer_reason

LE = ("letsencrypt", CaaIssuer(("letsencrypt.org",), "https://le.test/acct/1"))
ZEROSSL = ("zerossl", CaaIssuer(("sectigo.com", "zerossl.com"), "https://zerossl.test/acct/9"))
GTS = ("gts", CaaIssuer(("pki.goog",), "https://gts.test/acct/3"))
ISSUERS = (LE, ZEROSSL, GTS)
HOST = "shop.customer.test"
EDGE = "edge.saas.test"


class Zone:
    """CAA answers by name: the customer's hostname aliases the edge."""

    def __init__(self, edge: list[str] | None = None, apex: list[str] | None = None) -> None:
        self.edge = edge or []
        self.apex = apex or []

    async def __call__(self, name: str) -> CaaAnswerSet:
        if name == HOST:
            cnames = [CnameAnswer(HOST, EDGE)]
            return CaaAnswerSet(
                cnames=cnames, caa=[CaaAnswer(EDGE, CaaRecord(0, "issue", v)) for v in self.edge]
            )
        if name == "customer.test":
            return CaaAnswerSet(caa=[CaaAnswer(name, CaaRecord(0, "issue", v)) for v in self.apex])
        return CaaAnswerSet()


async def test_no_caa_allows_every_issuer_in_order() -> None:
    found = await allowed_issuers(HOST, ISSUERS, Zone())
    allowed, reason = found.names, found.reason
    assert allowed == ["letsencrypt", "zerossl", "gts"]
    assert "any CA may issue" in reason


async def test_caa_naming_one_ca_allows_only_it() -> None:
    found = await allowed_issuers(HOST, ISSUERS, Zone(apex=["pki.goog"]))
    allowed, reason = found.names, found.reason
    assert allowed == ["gts"]
    allowed = (await allowed_issuers(HOST, ISSUERS, Zone(apex=["zerossl.com", "pki.goog"]))).names
    assert allowed == ["zerossl", "gts"]


async def test_the_edge_set_decides_before_the_apex() -> None:
    """As the CA reads it: the CAA set at the end of the alias chain decides."""
    found = await allowed_issuers(
        HOST, ISSUERS, Zone(edge=["sectigo.com"], apex=["letsencrypt.org"])
    )
    allowed, reason = found.names, found.reason
    assert allowed == ["zerossl"]
    assert EDGE in reason


async def test_accounturi_is_judged_per_issuer() -> None:
    other = "letsencrypt.org; accounturi=https://le.test/acct/999"
    allowed = (await allowed_issuers(HOST, ISSUERS, Zone(apex=[other, "pki.goog"]))).names
    assert allowed == ["gts"]
    ours = "letsencrypt.org; accounturi=https://le.test/acct/1"
    allowed = (await allowed_issuers(HOST, ISSUERS, Zone(apex=[ours]))).names
    assert allowed == ["letsencrypt"]


async def test_no_issuer_allowed_names_what_caa_would_have_to_allow() -> None:
    with pytest.raises(DnsCheckError) as caught:
        await allowed_issuers(HOST, ISSUERS, Zone(apex=["digicert.com"]))
    err = caught.value
    assert err.code is ErrorCode.DNS_CAA
    assert "allows only digicert.com" in err.message
    assert "letsencrypt.org, sectigo.com, zerossl.com, pki.goog" in err.message
    assert err.expected == "letsencrypt.org, sectigo.com, zerossl.com, pki.goog"
    assert err.found == ['0 issue "digicert.com"']


async def test_one_issuer_keeps_the_single_ca_message() -> None:
    with pytest.raises(DnsCheckError) as caught:
        await allowed_issuers(HOST, (LE,), Zone(apex=["digicert.com"]))
    assert caught.value.message == "CAA at customer.test allows only digicert.com (applies to shop.customer.test)"


@pytest.mark.parametrize(
    ("allowed", "preferred", "passed_over", "chosen"),
    [
        (["letsencrypt", "zerossl"], None, {}, "letsencrypt"),
        (["zerossl", "gts"], None, {}, "zerossl"),  # CAA allows only these
        (["letsencrypt", "zerossl"], None, {"letsencrypt"}, "zerossl"),  # fell back
        (["letsencrypt", "zerossl"], "zerossl", {}, "zerossl"),  # renewal stays
        (["letsencrypt", "gts"], "zerossl", {}, "letsencrypt"),  # its CA no longer allowed
        (["letsencrypt", "zerossl"], "zerossl", {"zerossl"}, "letsencrypt"),  # and fell back
        (["letsencrypt", "zerossl"], None, {"letsencrypt", "zerossl"}, "letsencrypt"),  # all: over
        ([], None, {}, None),  # a history from before issuers
    ],
)
def test_choose_issuer(
    allowed: list[str], preferred: str | None, passed_over: set[str], chosen: str | None
) -> None:
    assert choose_issuer(allowed, preferred, passed_over) == chosen


def test_fallback_needs_another_allowed_issuer() -> None:
    assert fallback_issuers(["letsencrypt", "zerossl"], "letsencrypt", {}) == ["zerossl"]
    assert fallback_issuers(["letsencrypt", "zerossl"], "letsencrypt", {"zerossl": "x"}) == []
    assert fallback_issuers(["letsencrypt"], "letsencrypt", {}) == []


def test_issuer_reason_says_why_not_the_first() -> None:
    configured = ["letsencrypt", "zerossl", "gts"]
    assert issuer_reason("letsencrypt", configured, configured, {}, None) is None
    assert issuer_reason("gts", configured, ["gts"], {}, None) == (
        "CAA does not allow letsencrypt; CAA does not allow zerossl"
    )
    passed = {"letsencrypt": "letsencrypt, rate-limited until 2026-12-08 10:00 UTC: too many"}
    assert issuer_reason("zerossl", configured, configured, passed, None) == (
        "fell back from letsencrypt, rate-limited until 2026-12-08 10:00 UTC: too many"
    )
    assert issuer_reason("zerossl", configured, configured, {}, "zerossl") == (
        "the renewal stays with the CA of the current certificate"
    )
    assert issuer_reason(None, [], [], {}, None) is None


def test_fallback_outcome_is_a_fresh_budget_without_the_old_order() -> None:
    first = fallback_outcome(CertificateStatus.PROVISIONING, ErrorCode.ACME_INVALID_ORDER)
    assert (first.status, first.retry_count, first.keep_order) == (CertificateStatus.PENDING, 0, False)
    renewal = fallback_outcome(CertificateStatus.RENEWING, ErrorCode.ACME_RATE_LIMITED)
    assert renewal.status is CertificateStatus.RENEWING
    assert renewal.error_code is ErrorCode.ACME_RATE_LIMITED


def test_external_account_binding_is_the_rfc_8555_jws() -> None:
    """RFC 8555 §7.3.4: protected header {alg: HS256, kid, url: newAccount}, payload
    the account's public JWK, signature HMAC-SHA256 over "protected.payload" with
    the CA's MAC key (computed here independently of josepy)."""
    mac_key = b"\x8c" * 32
    eab = ExternalAccountBinding(
        kid="kid-1", hmac_key=SecretStr(base64.urlsafe_b64encode(mac_key).rstrip(b"=").decode())
    )
    account = JWKEC(key=ec.generate_private_key(ec.SECP256R1()))
    directory = messages.Directory.from_json(
        {"newAccount": "https://ca.test/acme/new-acct", "newNonce": "https://ca.test/nonce"}
    )
    jws = external_account_binding(account, eab, directory)
    protected = json.loads(b64decode(jws["protected"]))
    assert protected == {"alg": "HS256", "kid": "kid-1", "url": "https://ca.test/acme/new-acct"}
    payload = json.loads(b64decode(jws["payload"]))
    assert payload == account.public_key().to_partial_json()
    assert "d" not in payload  # the public key only
    signed = f"{jws['protected']}.{jws['payload']}".encode()
    expected = hmac.new(mac_key, signed, hashlib.sha256).digest()
    assert b64decode(jws["signature"]) == expected


async def test_an_account_registered_after_start_brings_its_url_to_caa() -> None:
    """The worker hands DnsChecker a function: an issuer registered on first use
    (its CA was down at start-up) is judged with its account URL from then on."""
    account_urls: dict[str, str | None] = {"zerossl": None}
    checker = DnsChecker(
        "127.0.0.1:53",
        EDGE,
        "letsencrypt.org",
        issuers=lambda: (
            LE,
            ("zerossl", CaaIssuer(("sectigo.com",), account_urls["zerossl"])),
        ),
    )
    bound = Zone(apex=["sectigo.com; accounturi=https://zerossl.test/acct/9"])
    with pytest.raises(DnsCheckError):
        await allowed_issuers(HOST, checker.caa_issuers, bound)
    account_urls["zerossl"] = "https://zerossl.test/acct/9"
    allowed = (await allowed_issuers(HOST, checker.caa_issuers, bound)).names
    assert allowed == ["zerossl"]
