"""dns-persist-01 judged rule for rule as Boulder's VA judges it: letsencrypt/boulder
``va/dns_persist.go`` (parseDNSPersistRecord, checkDNSPersistRecord,
validateDNSPersist01) and ``core/util.go`` NormalizeIssuerDomainName; one test per
rule, each naming the Boulder function it follows. Then the challenge's own
``accounturi`` (issue 39 item 5): compared before the accept, so no validation is
spent on a record the CA would refuse.

Shown red once each (the rule broken in certflow/dns/persist.py, the test failing):
see the docstrings."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from acme import messages

from certflow.acme.new_order import NewOrders
from certflow.dns.persist import (
    MalformedRecord,
    PersistParams,
    check_challenge,
    check_record,
    judge,
    normalize_issuer_domain_name,
    parse_record,
)
from certflow.errors import DnsCheckError, ErrorCode
from certflow.models import ValidationMethod

ACCOUNT = "https://ca.example/acct/42"
NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)
HOST = "shop.test"
OURS = ["ca.example"]


def _verdict(*records: str, host: str = HOST, issuers: list[str] = OURS) -> str | None:
    return judge(list(records), host, issuers, ACCOUNT, NOW)


def _ok(record: str) -> None:
    assert _verdict(record) is None, _verdict(record)


def _malformed(record: str, issuer: str = "ca.example") -> str:
    with pytest.raises(MalformedRecord) as raised:
        parse_record(record)
    assert raised.value.issuer == issuer
    return raised.value.reason


# -- the issuer-domain-name (parseDNSPersistRecord, core.NormalizeIssuerDomainName) --


def test_the_issuer_is_what_precedes_the_first_semicolon_space_and_tab_trimmed() -> None:
    """Boulder va/dns_persist.go parseDNSPersistRecord: ``strings.Split(record, ";")``,
    ``strings.TrimFunc(parts[0], isWSP)`` (SP and HTAB only). A newline is no WSP:
    the issuer keeps it and is no domain name."""
    _ok(f" \tca.example \t;accounturi={ACCOUNT}")
    assert parse_record(f"ca.example;accounturi={ACCOUNT}") == ("ca.example", PersistParams(ACCOUNT))
    assert _malformed(f"\nca.example; accounturi={ACCOUNT}", issuer="").startswith(
        "its issuer-domain-name is malformed"
    )


def test_an_empty_issuer_is_malformed_and_the_record_skipped() -> None:
    """Boulder parseDNSPersistRecord: ``rawIssuer == ""`` → "empty issuer-domain-name",
    returned with no issuer, so validateDNSPersist01 skips it (``receivedIssuer ==
    va.issuerDomain`` is false)."""
    assert _malformed(f"; accounturi={ACCOUNT}", issuer="") == "has no issuer-domain-name"
    verdict = _verdict(f"  ; accounturi={ACCOUNT}")
    assert verdict is not None and verdict.startswith("no record for ca.example (skipped")


def test_an_issuer_with_a_trailing_dot_is_ours() -> None:
    """Boulder core/util.go NormalizeIssuerDomainName: ``strings.TrimSuffix(name, ".")``
    — one dot (a second one stays, and the name is another).

    Red with ``removesuffix(".")`` taken out of normalize_issuer_domain_name."""
    _ok(f"ca.example.; accounturi={ACCOUNT}")
    assert normalize_issuer_domain_name("ca.example..") == "ca.example."
    assert _verdict(f"ca.example..; accounturi={ACCOUNT}") == "no record for ca.example"


def test_an_issuer_in_upper_case_is_ours() -> None:
    """Boulder NormalizeIssuerDomainName: ``strings.ToLower`` first (and the UTS 46
    mapping of ``idna.Lookup`` folds case too); va_test's "LETSENCRYPT.ORG."."""
    _ok(f"CA.Example; accounturi={ACCOUNT}")
    _ok(f"CA.EXAMPLE.; accounturi={ACCOUNT}")


def test_an_issuer_as_a_u_label_is_ours_once_normalized() -> None:
    """Boulder NormalizeIssuerDomainName: ``norm.NFC.String`` then
    ``idna.Lookup.ToASCII``: a U-label (composed or not) or an A-label in any case
    is the A-label; the UTS 46 mapping turns full-width letters and the ideographic
    full stop into ASCII.

    Red with the normalization replaced by ``lower().rstrip(".")`` (the old rule)."""
    punycode = ["xn--bcher-kva.example"]
    for issuer in ("bücher.example", "Bu\u0308cher.example.", "XN--BCHER-KVA.EXAMPLE"):
        assert normalize_issuer_domain_name(issuer) == "xn--bcher-kva.example"
        assert _verdict(f"{issuer}; accounturi={ACCOUNT}", issuers=punycode) is None, issuer
    _ok(f"ｃａ。ｅｘａｍｐｌｅ; accounturi={ACCOUNT}")
    # Ours written as a U-label in the configuration compares the same.
    assert _verdict(f"xn--bcher-kva.example; accounturi={ACCOUNT}", issuers=["bücher.example"]) is None


def test_an_issuer_idna_refuses_is_malformed_and_the_record_skipped() -> None:
    """Boulder NormalizeIssuerDomainName: ``idna.Lookup`` has UseSTD3ASCIIRules and
    CheckHyphens: ``_``, a hyphen first or last, ``--`` in the 3rd and 4th places
    (x/net/idna validateLabel V2, V3) fail, and parseDNSPersistRecord returns no
    issuer: the record is skipped, even if it would read as ours."""
    # "xn--zz": Punycode cut short (its second digit asks for a third).
    for issuer in ("ca_example", "-ca.example", "ca-.example", "ab--ca.example", "xn--zz.example"):
        with pytest.raises(ValueError):
            normalize_issuer_domain_name(issuer)
        assert _malformed(f"{issuer}; accounturi={ACCOUNT}", issuer="").startswith(
            "its issuer-domain-name is malformed"
        )
    # Empty labels pass (Lookup does not VerifyDNSLength): "ca..example" is a name, not ours.
    assert normalize_issuer_domain_name("ca..example") == "ca..example"


def test_an_issuer_over_253_octets_is_malformed() -> None:
    """Boulder NormalizeIssuerDomainName: "exceeds 253 octets" after the trailing dot
    is gone."""
    long = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253
    assert normalize_issuer_domain_name(long + ".") == long
    with pytest.raises(ValueError, match="253"):
        normalize_issuer_domain_name(long + "c")


def test_the_issuer_compares_normalized_on_both_sides() -> None:
    """Boulder validateDNSPersist01: ``receivedIssuer != va.issuerDomain``, the VA's
    own issuer domain normalized already (va.go NewValidationAuthorityImpl refuses
    one that is not)."""
    assert _verdict(f"ca.example; accounturi={ACCOUNT}", issuers=["CA.Example."]) is None


# -- the parameters (parseDNSPersistRecord) -------------------------------------------


def test_an_empty_parameter_or_a_trailing_semicolon_is_malformed() -> None:
    """Boulder parseDNSPersistRecord: "empty parameter or trailing semicolon provided"."""
    assert _malformed(f"ca.example; accounturi={ACCOUNT};") == "has an empty parameter or a trailing semicolon"
    assert _malformed(f"ca.example;; accounturi={ACCOUNT}").startswith("has an empty parameter")
    assert "empty parameter" in (_verdict(f"ca.example; accounturi={ACCOUNT}; ") or "")


def test_a_parameter_without_an_equals_sign_is_malformed() -> None:
    """Boulder parseDNSPersistRecord: ``strings.SplitN(param, "=", 2)`` of length 1 →
    "should be tag=value pair"."""
    assert _malformed(f"ca.example; accounturi={ACCOUNT}; wildcard") == "parameter 'wildcard' is no tag=value pair"


def test_an_empty_tag_is_malformed() -> None:
    """Boulder parseDNSPersistRecord: ``tag == ""`` → "empty tag" (va_test "=abc").
    certflow accepted ``=x`` before.

    Red with the ``if not tag`` check taken out of parse_record."""
    assert _malformed(f"ca.example; accounturi={ACCOUNT}; =x") == "parameter '=x' has an empty tag"
    assert _malformed(f"ca.example; accounturi={ACCOUNT}; \t = x") == "parameter '= x' has an empty tag"
    verdict = _verdict(f"ca.example; accounturi={ACCOUNT}; =x")
    assert verdict is not None and "has an empty tag" in verdict


def test_tags_and_values_are_trimmed_of_space_and_tab() -> None:
    """Boulder parseDNSPersistRecord: the parameter, then its tag and value, each
    ``strings.TrimFunc(…, isWSP)`` (va_test "heavy whitespace")."""
    _ok(f"ca.example ;   accounturi \t=  {ACCOUNT}  ;  persistUntil =  4102444800 ")


def test_a_value_must_be_printable_ascii_without_semicolon_whatever_its_tag() -> None:
    """Boulder parseDNSPersistRecord: every rune of every value in %x21-3A / %x3C-7E,
    checked before the tag is recognized: an unknown tag's bad value spoils the
    record too. An empty value and ``=`` inside one are fine."""
    for value in ("wild card", "é", "a\x01"):
        assert "holds a space, a control or a non-ASCII character" in _malformed(
            f"ca.example; accounturi={ACCOUNT}; note={value}"
        )
    _ok(f"ca.example; accounturi={ACCOUNT}; note=; other=a==b")


def test_tags_compare_in_lower_case_as_go_lowers() -> None:
    """Boulder parseDNSPersistRecord: ``strings.ToLower(tag)`` before the switch (Go
    maps U+0130 to a plain ``i``)."""
    _ok(f"ca.example; AccountURI={ACCOUNT}; PERSISTUNTIL=4102444800")
    _ok(f"ca.example; ACCOUNTUR\u0130={ACCOUNT}")


def test_a_hyphenated_or_odd_unknown_tag_is_ignored() -> None:
    """Boulder parseDNSPersistRecord: ``default: continue`` ("the server MUST ignore any
    parameter ... that has an unrecognized tag"); the tag's own characters are never
    checked (va_test "bad tag=value", "\\nweird"). certflow refused a hyphenated tag
    before (RFC 8659's tag grammar)."""
    _ok(f"ca.example; accounturi={ACCOUNT}; x-custom=1")
    _ok(f"ca.example; accounturi={ACCOUNT}; bad tag=value;\nweird=\\x01337")


def test_repeated_unknown_tags_are_ignored() -> None:
    """Boulder parseDNSPersistRecord: only the three known tags go through ``seenTag``
    (va_test "Duplicate unknown parameter is ignored").

    Red with the duplicate check moved before the unknown-tag ``continue``."""
    _ok(f"ca.example; accounturi={ACCOUNT}; foo=bar; foo=baz; FOO=qux")


def test_a_repeated_known_tag_is_malformed_in_any_case() -> None:
    """Boulder parseDNSPersistRecord: ``seenTag(canonicalTag)`` → "duplicate parameter"
    for accounturi, policy and persistUntil (va_test: "ACCOUNTURI" then "accounturi")."""
    assert _malformed(f"ca.example; ACCOUNTURI={ACCOUNT}; accounturi=other") == "repeats a parameter (accounturi)"
    assert _malformed(f"ca.example; accounturi={ACCOUNT}; policy=wildcard; Policy=wildcard").startswith(
        "repeats a parameter"
    )
    assert _malformed(f"ca.example; accounturi={ACCOUNT}; persistUntil=1; persistuntil=2").startswith(
        "repeats a parameter"
    )


def test_accounturi_missing_or_empty_is_malformed() -> None:
    """Boulder parseDNSPersistRecord: "empty value provided for mandatory accounturi",
    "missing mandatory accounturi parameter" (an issuer alone too)."""
    assert _malformed("ca.example; accounturi=") == "has an empty accounturi"
    assert _malformed("ca.example; policy=wildcard") == "has no accounturi"
    assert _malformed("ca.example") == "has no accounturi"


def test_persist_until_is_read_as_strconv_parse_int() -> None:
    """Boulder parseDNSPersistRecord: ``strconv.ParseInt(value, 10, 64)``: a ``+`` or
    ``-`` sign is taken (``+N`` in the future passes, ``-N`` is long past), digits
    only (no ``_``, no ``0x``, not empty), within int64. certflow refused ``+N``
    before.

    Red with the sign taken out of ``_PARSE_INT``."""
    later = int((NOW + timedelta(days=1)).timestamp())
    _ok(f"ca.example; accounturi={ACCOUNT}; persistUntil=+{later}")
    _ok(f"ca.example; accounturi={ACCOUNT}; persistUntil=0{later}")
    _ok(f"ca.example; accounturi={ACCOUNT}; persistUntil=9223372036854775807")
    assert "expired at 1969-12-31 23:59 UTC" in (_verdict(f"ca.example; accounturi={ACCOUNT}; persistUntil=-1") or "")
    for value in ("", "+", "1_000", "0x10", "1.5", "soon", "9223372036854775808", "-9223372036854775809"):
        assert _malformed(f"ca.example; accounturi={ACCOUNT}; persistUntil={value}") == (
            f"persistUntil {value!r} is not a UNIX time"
        )


def test_persist_until_at_go_zero_time_reads_as_absent() -> None:
    """Boulder checkDNSPersistRecord: ``!params.persistUntil.IsZero()``: the second
    that ``time.Unix`` maps to Go's zero time (0001-01-01) reads as no limit."""
    _ok(f"ca.example; accounturi={ACCOUNT}; persistUntil=-62135596800")
    assert "expired" in (_verdict(f"ca.example; accounturi={ACCOUNT}; persistUntil=-62135596799") or "")


# -- one record against our account (checkDNSPersistRecord) ---------------------------


def test_accounturi_compares_as_plain_strings() -> None:
    """Boulder checkDNSPersistRecord: ``params.accountURI != validAccountURI`` (RFC 3986
    §6.2.1 simple string comparison, nothing folded) → "accounturi mismatch"."""
    assert check_record(PersistParams(ACCOUNT), ACCOUNT, False, NOW) is None
    for other in (ACCOUNT.upper(), ACCOUNT + "/", "https://CA.example/acct/42"):
        assert check_record(PersistParams(other), ACCOUNT, False, NOW) == f"names another account (ours is {ACCOUNT})"


def test_a_wildcard_needs_policy_wildcard_in_any_case_another_name_ignores_it() -> None:
    """Boulder checkDNSPersistRecord: ``wildcardName && strings.ToLower(params.policy) !=
    "wildcard"`` → "policy mismatch"; for another name the policy is not looked at."""
    assert check_record(PersistParams(ACCOUNT), ACCOUNT, True, NOW) == "lacks policy=wildcard, which a wildcard needs"
    assert check_record(PersistParams(ACCOUNT, "WildCard"), ACCOUNT, True, NOW) is None
    assert check_record(PersistParams(ACCOUNT, "notwildcard"), ACCOUNT, False, NOW) is None
    assert _verdict(f"ca.example; accounturi={ACCOUNT}; policy=wildcard", host="*.shop.test") is None


def test_persist_until_fails_only_after_its_second() -> None:
    """Boulder checkDNSPersistRecord: ``validatedAt.After(params.persistUntil)``,
    strictly after; checked last, after accounturi and policy."""
    until = int(NOW.timestamp())
    assert check_record(PersistParams(ACCOUNT, persist_until=until), ACCOUNT, False, NOW) is None
    later = NOW + timedelta(microseconds=1)
    assert "expired at 2026-12-02 00:00 UTC" in (
        check_record(PersistParams(ACCOUNT, persist_until=until), ACCOUNT, False, later) or ""
    )
    both = check_record(PersistParams("other", persist_until=0), ACCOUNT, False, NOW)
    assert both is not None and both.startswith("names another account")


# -- the record set (validateDNSPersist01) ------------------------------------------


def test_no_txt_record_at_all() -> None:
    """Boulder validateDNSPersist01: ``len(txts.Final) == 0`` → "No TXT record found"."""
    assert _verdict() == "no TXT record at all, so no record for ca.example"


def test_a_malformed_record_naming_our_issuer_is_skipped_when_another_passes() -> None:
    """Boulder validateDNSPersist01: a record parseDNSPersistRecord refuses is noted
    and skipped (``continue``), the loop goes on; a valid one after it authorizes
    (va_test "Matching malformed and matching valid record succeeds").

    Red with the loop returning at the first malformed record of ours."""
    for malformed in (f"ca.example; accounturi={ACCOUNT}; accounturi=other", f"ca.example; accounturi={ACCOUNT}; =x"):
        assert _verdict(malformed, f"ca.example; accounturi={ACCOUNT}") is None
        assert _verdict(f"ca.example; accounturi={ACCOUNT}", malformed) is None


def test_a_record_that_does_not_authorize_is_skipped_when_another_passes() -> None:
    """Boulder validateDNSPersist01: a checkDNSPersistRecord failure is noted and the
    loop goes on (va_test "Matching unauthorized and matching valid record succeeds")."""
    assert _verdict("ca.example; accounturi=https://ca.example/acct/999", f"ca.example; accounturi={ACCOUNT}") is None


def test_malformed_records_of_ours_are_the_reason_before_unauthorized_ones() -> None:
    """Boulder validateDNSPersist01: ``if len(syntaxErrs) > 0`` → the malformed problem,
    only then the unauthorized one."""
    verdict = _verdict("ca.example; accounturi=https://ca.example/acct/999", f"ca.example; accounturi={ACCOUNT}; =x")
    assert verdict == f"'ca.example; accounturi={ACCOUNT}; =x' parameter '=x' has an empty tag"
    unauthorized = _verdict("ca.example; accounturi=https://ca.example/acct/999")
    assert unauthorized is not None and "names another account" in unauthorized


def test_records_of_other_issuers_are_skipped_even_malformed() -> None:
    """Boulder validateDNSPersist01: a malformed record is reported only ``if
    receivedIssuer == va.issuerDomain``; a well-formed one of another issuer is
    skipped ("No valid TXT record found")."""
    assert _verdict(f"other.example; accounturi={ACCOUNT}; accounturi=x", f"other.example; accounturi={ACCOUNT}") == (
        "no record for ca.example"
    )


# -- the challenge's own accounturi (issue 39 item 5) ---------------------------------

DRAFT_02 = "https://ca.example/acme/acct/draft-02/42"


def _challenge(**fields: Any) -> dict[str, Any]:
    return {"type": "dns-persist-01", "url": "https://ca.example/chall/1", "status": "pending", **fields}


def test_a_challenge_expecting_another_accounturi_is_refused_naming_both() -> None:
    """The challenge carries what the VA compares (Boulder wfe2/wfe.go
    prepChallengeForDisplay: ``AccountURIPrefix`` + registration ID; va/va.go
    PerformValidation: ``accountURIPrefixes[0]`` + registration ID); a record judged
    against our account URL would be refused: DNS_PERSIST, both values named, the
    record to publish with the challenge's value.

    Red with the accounturi comparison taken out of check_challenge."""
    with pytest.raises(DnsCheckError) as raised:
        check_challenge(_challenge(accounturi=DRAFT_02, **{"issuer-domain-names": OURS}), HOST, OURS, ACCOUNT)
    err = raised.value
    assert err.code is ErrorCode.DNS_PERSIST
    assert f"expects accounturi={DRAFT_02}" in err.message and f"our account URL {ACCOUNT}" in err.message
    assert "nothing was accepted" in err.message
    assert err.expected == f"ca.example; accounturi={DRAFT_02}"
    assert f'publish _validation-persist.{HOST} TXT "ca.example; accounturi={DRAFT_02}"' in err.message


def test_a_challenge_agreeing_or_silent_is_accepted() -> None:
    """The same value, or a challenge without ``accounturi`` (a CA before draft-01's
    field): our account URL is what the CA compares."""
    check_challenge(_challenge(accounturi=ACCOUNT, **{"issuer-domain-names": ["CA.Example."]}), HOST, OURS, ACCOUNT)
    check_challenge(_challenge(), HOST, OURS, ACCOUNT)


def test_a_challenge_listing_none_of_our_issuer_domains_is_refused() -> None:
    """Boulder's VA compares the record's issuer with its own (validateDNSPersist01),
    the one the WFE lists in ``issuer-domain-names``: none of ours there, the record
    judged for ours would be skipped."""
    with pytest.raises(DnsCheckError) as raised:
        check_challenge(_challenge(accounturi=ACCOUNT, **{"issuer-domain-names": ["other.example"]}), HOST, OURS, ACCOUNT)
    assert "accepts issuer domain names other.example" in raised.value.message
    assert "checked for ca.example" in raised.value.message


class _Net:
    def __init__(self) -> None:
        self.posts: list[str] = []

    def post(self, url: str, obj: object, new_nonce_url: str | None = None) -> SimpleNamespace:
        self.posts.append(url)
        order = {
            "status": "pending",
            "identifiers": [{"type": "dns", "value": HOST}],
            "authorizations": ["https://ca.example/authz/1"],
            "finalize": "https://ca.example/finalize/1",
        }
        return SimpleNamespace(json=lambda: order, headers={"Location": "https://ca.example/order/1"})


def _orders(challenge: dict[str, Any]) -> tuple[NewOrders, SimpleNamespace]:
    """A NewOrders whose CA answers new-order with one authorization offering
    ``challenge`` (no network, no database)."""
    ca = SimpleNamespace(
        clients=SimpleNamespace(
            issuer=SimpleNamespace(name="ca", caa_domains=("ca.example",)),
            account_url=ACCOUNT,
            new_nonce_url=None,
            key_authorization=lambda token: f"{token}.k",
        ),
        profile=None,
        post_as_get=lambda client, url: None,
    )
    orders = NewOrders(ca)  # type: ignore[arg-type]
    authz = messages.Authorization.from_json(
        {"identifier": {"type": "dns", "value": HOST}, "status": "pending", "challenges": [challenge]}
    )
    orders._fetch_authorization = lambda client, url: authz  # type: ignore[method-assign, assignment]
    client = SimpleNamespace(directory={"newOrder": "https://ca.example/new-order"}, net=_Net())
    return orders, client


def test_the_order_step_refuses_a_challenge_expecting_another_account_before_any_accept() -> None:
    """certflow/acme/new_order.py ``_open_order`` reads the dns-persist-01 challenge
    it picked and raises DNS_PERSIST before returning it: nothing is persisted for
    the accept, and the only POST the CA saw is new-order.

    Red with the check_challenge call taken out of ``_open_order``."""
    orders, client = _orders(_challenge(accounturi=DRAFT_02, **{"issuer-domain-names": OURS}))
    with pytest.raises(DnsCheckError) as raised:
        orders._open_order(client, HOST, None, [ValidationMethod.DNS_PERSIST_01])  # type: ignore[arg-type]
    assert raised.value.code is ErrorCode.DNS_PERSIST and DRAFT_02 in raised.value.message
    assert client.net.posts == ["https://ca.example/new-order"]
    agreeing, client = _orders(_challenge(accounturi=ACCOUNT, **{"issuer-domain-names": OURS}))
    opened = agreeing._open_order(client, HOST, None, [ValidationMethod.DNS_PERSIST_01])  # type: ignore[arg-type]
    assert opened.method is ValidationMethod.DNS_PERSIST_01 and opened.challenge_url == "https://ca.example/chall/1"
