"""DNS pre-checks (docs/lifecycle.md, "Before the CA is asked"): CAA decisions, the CAA walk, the CNAME chain.

With fake lookups, and (for CAA) on recorded DNS answers: dnspython messages
built from text and served in place of the network, so the same query and
parsing code as in production runs.
"""

from __future__ import annotations

import asyncio

from collections.abc import Mapping, Sequence

import dns.asyncquery
import dns.exception
import dns.message
import dns.rdatatype
import pytest

from certflow.dns.caa_records import CaaAnswer, CaaAnswerSet, CaaRecord, parse_caa_response
from certflow.dns.caa_verdict import CaaIssuer, caa_allows, caa_decision, check_caa
from certflow.dns.caa_climb import CaaSet, caa_lookup_names, find_caa_set
from certflow.dns.lookup import CnameAnswer, DnsLookupError, parse_resolver_address
from certflow.dns.checks import DnsChecker
from certflow.dns.cname import follow_cname_chain
from certflow.errors import ConfigError, DnsCheckError, ErrorCode

LE = "letsencrypt.org"
TARGET = "custom.saas.test"


def issue(value: str, flags: int = 0) -> CaaRecord:
    return CaaRecord(flags, "issue", value)


# --------------------------------------------------------------------------- caa_decision


ALLOWED_CASES: list[tuple[str, list[CaaRecord]]] = [
    ("issue match", [issue(LE)]),
    ("one of several issuers", [issue("other-ca.org"), issue(LE)]),
    ("tag case-insensitive", [CaaRecord(0, "ISSUE", LE)]),
    ("tag mixed case", [CaaRecord(0, "IsSuE", LE)]),
    ("unknown parameter after ;", [issue(f"{LE}; foo=https://acme.example/acct/1")]),
    ("several parameters", [issue(f"{LE}; a=1; validationmethods=http-01")]),
    ("validationmethods ours", [issue(f"{LE}; validationmethods=http-01")]),
    ("validationmethods ours among others", [issue(f"{LE}; validationmethods=http-01,dns-01")]),
    ("validationmethods ours second", [issue(f"{LE}; validationmethods=dns-01,http-01")]),
    # Boulder reads the list in order: ours before a malformed label still allows.
    ("validationmethods ours, then malformed", [issue(f"{LE}; validationmethods=http-01,x_y")]),
    # Boulder compares parameter tags exactly: these are unknown parameters, ignored.
    ("ValidationMethods is not validationmethods", [issue(f"{LE}; ValidationMethods=dns-01")]),
    ("AccountURI is not accounturi", [issue(f"{LE}; AccountURI=https://ca.test/acct/9")]),
    ("parameter with empty value", [issue(f"{LE}; foo=")]),
    ("parameter value with '='", [issue(f"{LE}; foo=a=b")]),
    ("empty parameter list", [issue(f"{LE};")]),
    ("surrounding whitespace", [issue(f"  {LE}\t ;  a=b  ")]),
    ("issuewild only (non-wildcard name)", [CaaRecord(0, "issuewild", "other-ca.org")]),
    ("issuewild ';' ignored for non-wildcard", [CaaRecord(0, "issuewild", ";"), issue(LE)]),
    ("iodef only", [CaaRecord(0, "iodef", "mailto:sec@acme.test")]),
    ("critical iodef is known", [CaaRecord(128, "iodef", "mailto:sec@acme.test")]),
    ("non-critical unknown tag ignored", [CaaRecord(0, "tbs", "x"), issue(LE)]),
    ("non-critical unknown tag, no issue", [CaaRecord(0, "future", "x")]),
    ("critical issue is known", [issue(LE, flags=128)]),
    ("malformed one, valid other", [issue("not a domain!"), issue(LE)]),
]


@pytest.mark.parametrize(("case", "records"), ALLOWED_CASES, ids=[c for c, _ in ALLOWED_CASES])
def test_caa_allows(case: str, records: list[CaaRecord]) -> None:
    verdict = caa_decision(records, LE, owner="acme.test")
    assert verdict.allowed, verdict.reason
    assert "acme.test" in verdict.reason


DENIED_CASES: list[tuple[str, list[CaaRecord], str]] = [
    ("issue mismatch", [issue("other-ca.org")], "allows only other-ca.org"),
    ("two other issuers", [issue("a-ca.org"), issue("b-ca.org")], "only a-ca.org, b-ca.org"),
    ("critical unknown, flags 128", [CaaRecord(128, "tbs", "x"), issue(LE)], "unknown critical"),
    ("critical unknown, flags 1", [CaaRecord(1, "tbs", "x"), issue(LE)], "unknown critical"),
    ("critical unknown, flags 129", [CaaRecord(129, "TBS", "x")], "unknown critical"),
    ("critical unknown, flags 3", [CaaRecord(3, "tbs", "x"), issue(LE)], "unknown critical"),
    # Boulder does not know contactemail/contactphone: critical ones forbid.
    (
        "critical contactemail",
        [CaaRecord(128, "contactemail", "a@acme.test"), issue(LE)],
        "unknown critical",
    ),
    ("empty issuer ';'", [issue(";")], "forbids all"),
    ("empty value", [issue("")], "forbids all"),
    ("';' with parameters", [issue("; a=b")], "forbids all"),
    ("malformed value", [issue("letsencrypt.org/x")], "malformed"),
    ("issuer with trailing dot", [issue("letsencrypt.org.")], "malformed"),
    ("issuer label starts with hyphen", [issue("-letsencrypt.org")], "malformed"),
    ("issuer with space inside", [issue("letsencrypt .org")], "malformed"),
    ("bad parameter (no =)", [issue(f"{LE}; accounturi")], "malformed"),
    ("bad parameter tag", [issue(f"{LE}; bad_tag=1")], "malformed"),
    ("hyphen in parameter tag (Boulder)", [issue(f"{LE}; a-b=1")], "malformed"),
    ("bad parameter value", [issue(f"{LE}; a=b c")], "malformed"),
    ("trailing ; after parameter", [issue(f"{LE}; a=b;")], "malformed"),
    ("superdomain of issuer", [issue("org")], "allows only org"),
    # Boulder's caaDomainMatches is ==: another case is another issuer (shown red
    # when issuer domains were lower-cased before comparing).
    (
        "issuer in another case",
        [issue("LetsEncrypt.ORG")],
        "allows only LetsEncrypt.ORG (issuer domains compare exactly, as at the CA:"
        " LetsEncrypt.ORG is not letsencrypt.org)",
    ),
    ("subdomain of issuer", [issue(f"ca.{LE}")], f"allows only ca.{LE}"),
    ("';' plus other issuer", [issue(";"), issue("other-ca.org")], "allows only other-ca.org"),
    (
        "validationmethods dns-01 only",
        [issue(f"{LE}; validationmethods=dns-01")],
        f"allows {LE} only with validationmethods=dns-01 (we validate with http-01)",
    ),
    (
        "validationmethods upper case",
        [issue(f"{LE}; validationmethods=HTTP-01")],
        "only with validationmethods=HTTP-01 (we validate with http-01)",
    ),
    (
        "validationmethods empty",
        [issue(f"{LE}; validationmethods=")],
        "only with validationmethods= (malformed, so it allows no method)",
    ),
    (
        "validationmethods malformed before ours",
        [issue(f"{LE}; validationmethods=x_y,http-01")],
        "(malformed, so it allows no method)",
    ),
    (
        "validationmethods unknown method",
        [issue(f"{LE}; validationmethods=tls-sni-01")],
        "only with validationmethods=tls-sni-01",
    ),
    (
        "two validationmethods parameters",
        [issue(f"{LE}; validationmethods=http-01; validationmethods=http-01")],
        "with 2 validationmethods parameters, which no method satisfies",
    ),
    (
        "accounturi while our account is unknown",
        [issue(f"{LE}; accounturi=https://ca.test/acct/1")],
        f"allows {LE} only for account https://ca.test/acct/1 "
        "(our ACME account URL is not known yet)",
    ),
    (
        "refused by a parameter, other issuer",
        [issue(f"{LE}; validationmethods=dns-01"), issue("digicert.com")],
        "(we validate with http-01); otherwise it allows only digicert.com",
    ),
]


@pytest.mark.parametrize(
    ("case", "records", "words"), DENIED_CASES, ids=[c for c, _, _ in DENIED_CASES]
)
def test_caa_denies(case: str, records: list[CaaRecord], words: str) -> None:
    verdict = caa_decision(records, LE, owner="acme.test")
    assert not verdict.allowed
    assert verdict.reason.startswith("CAA at acme.test ")
    assert words in verdict.reason


def test_caa_reason_example() -> None:
    verdict = caa_decision([issue("other-ca.org")], LE, owner="acme.test")
    assert verdict.reason == "CAA at acme.test allows only other-ca.org"


def test_caa_configured_issuer_is_case_and_dot_insensitive() -> None:
    assert caa_decision([issue(LE)], "LetsEncrypt.org.", owner="acme.test").allowed


def test_caa_without_owner() -> None:
    verdict = caa_decision([issue("other-ca.org")], LE)
    assert verdict == caa_decision([issue("other-ca.org")], LE, owner="")
    assert verdict.reason == "CAA allows only other-ca.org"


def test_caa_malformed_values_are_quoted_short() -> None:
    verdict = caa_decision([issue("x" * 500 + "!")], LE, owner="acme.test")
    assert not verdict.allowed
    assert len(verdict.reason) < 200


def test_caa_wildcard_uses_issuewild_when_present() -> None:
    records = [issue(LE), CaaRecord(0, "issuewild", "other-ca.org")]
    assert caa_decision(records, LE, owner="acme.test").allowed
    denied = caa_decision(records, LE, owner="acme.test", wildcard=True)
    assert not denied.allowed
    assert denied.reason == "CAA at acme.test allows only other-ca.org"


def test_caa_wildcard_falls_back_to_issue() -> None:
    assert caa_decision([issue(LE)], LE, wildcard=True).allowed
    assert not caa_decision([issue("other-ca.org")], LE, wildcard=True).allowed


def test_caa_record_presentation() -> None:
    assert issue(LE).to_text() == '0 issue "letsencrypt.org"'
    assert CaaRecord(128, "tbs", 'a"b\\c').to_text() == '128 tbs "a\\"b\\\\c"'
    assert CaaRecord(0, "iodef", "a\nb").to_text() == '0 iodef "a\\010b"'


# --------------------------------------------------------------------------- RFC 8657 parameters

ACCOUNT = "https://ca.test/acme/acct/1"
OTHER_ACCOUNT = "https://ca.test/acme/acct/2"
OURS = CaaIssuer((LE,), account_uri=ACCOUNT)


def test_accounturi_equal_allows() -> None:
    verdict = caa_decision([issue(f"{LE}; accounturi={ACCOUNT}")], OURS, owner="acme.test")
    assert verdict.allowed, verdict.reason


def test_accounturi_and_validationmethods_both_satisfied() -> None:
    value = f"{LE}; accounturi={ACCOUNT}; validationmethods=http-01"
    assert caa_decision([issue(value)], OURS, owner="acme.test").allowed


def test_accounturi_different_denies() -> None:
    verdict = caa_decision([issue(f"{LE}; accounturi={OTHER_ACCOUNT}")], OURS, owner="acme.test")
    assert not verdict.allowed
    assert verdict.reason == (
        f"CAA at acme.test allows {LE} only for account {OTHER_ACCOUNT} (ours is {ACCOUNT})"
    )


def test_accounturi_compared_exactly() -> None:
    # Boulder compares the strings: no URL normalization (case, trailing slash).
    for variant in (ACCOUNT + "/", ACCOUNT.upper(), ACCOUNT.replace("https", "http")):
        verdict = caa_decision([issue(f"{LE}; accounturi={variant}")], OURS, owner="acme.test")
        assert not verdict.allowed, variant


@pytest.mark.parametrize(
    ("ours", "legacy"),
    [
        (ACCOUNT, "https://ca.test/acme/reg/1"),
        ("https://acme-v02.api.letsencrypt.org/acme/acct/77", "https://acme-v01.api.letsencrypt.org/acme/reg/77"),
        ("https://acme-v02.api.letsencrypt.org/acme/acct/77", "https://acme-v02.api.letsencrypt.org/acme/reg/77"),
    ],
)
def test_accounturi_in_the_legacy_reg_form_allows(ours: str, legacy: str) -> None:
    """Boulder's va/caa.go caaAccountURIMatches takes each of the CA's
    accountURIPrefixes followed by the account id: Let's Encrypt lists the ACMEv1
    ``/acme/reg/`` prefix beside ``/acme/acct/``. Red with the exact comparison
    back (checked once); another id in that form still refuses."""
    issuer = CaaIssuer((LE,), account_uri=ours)
    assert caa_decision([issue(f"{LE}; accounturi={legacy}")], issuer, owner="acme.test").allowed
    other_id = legacy.rsplit("/", 1)[0] + "/78"
    assert not caa_decision([issue(f"{LE}; accounturi={other_id}")], issuer, owner="acme.test").allowed


def test_accounturi_one_of_several_records_matches() -> None:
    records = [issue(f"{LE}; accounturi={OTHER_ACCOUNT}"), issue(f"{LE}; accounturi={ACCOUNT}")]
    assert caa_decision(records, OURS, owner="acme.test").allowed


def test_accounturi_several_records_none_ours() -> None:
    records = [issue(f"{LE}; accounturi={OTHER_ACCOUNT}"), issue(f"{LE}; accounturi=https://x/3")]
    verdict = caa_decision(records, OURS, owner="acme.test")
    assert not verdict.allowed
    assert verdict.reason == (
        f"CAA at acme.test allows {LE} only for account {OTHER_ACCOUNT} (ours is {ACCOUNT}), "
        f"or only for account https://x/3 (ours is {ACCOUNT})"
    )


def test_accounturi_twice_in_one_value_is_unsatisfiable() -> None:
    value = f"{LE}; accounturi={ACCOUNT}; accounturi={ACCOUNT}"
    verdict = caa_decision([issue(value)], OURS, owner="acme.test")
    assert not verdict.allowed
    assert "2 accounturi parameters, which no account satisfies" in verdict.reason


def test_accounturi_with_unknown_account_denies() -> None:
    unknown = CaaIssuer((LE,))
    assert unknown.account_uri is None
    verdict = caa_decision([issue(f"{LE}; accounturi={ACCOUNT}")], unknown, owner="acme.test")
    assert not verdict.allowed
    assert verdict.reason == (
        f"CAA at acme.test allows {LE} only for account {ACCOUNT} "
        "(our ACME account URL is not known yet)"
    )


def test_account_and_method_refusals_both_named() -> None:
    value = f"{LE}; accounturi={OTHER_ACCOUNT}; validationmethods=dns-01"
    verdict = caa_decision([issue(value)], OURS, owner="acme.test")
    assert verdict.reason == (
        f"CAA at acme.test allows {LE} only for account {OTHER_ACCOUNT} (ours is {ACCOUNT}) "
        "and only with validationmethods=dns-01 (we validate with http-01)"
    )


def test_right_account_wrong_method_denies() -> None:
    value = f"{LE}; accounturi={ACCOUNT}; validationmethods=dns-01"
    verdict = caa_decision([issue(value)], OURS, owner="acme.test")
    assert not verdict.allowed
    assert verdict.reason == (
        f"CAA at acme.test allows {LE} only with validationmethods=dns-01 "
        "(we validate with http-01)"
    )


def test_long_parameter_values_are_cut_short() -> None:
    verdict = caa_decision([issue(f"{LE}; accounturi=https://x/{'a' * 500}")], OURS)
    assert not verdict.allowed
    assert len(verdict.reason) < 300


def test_issuer_with_several_domains() -> None:
    issuer = CaaIssuer(("LetsEncrypt.org.", "lencr.org"))
    assert issuer.domains == (LE, "lencr.org")
    assert caa_decision([issue("lencr.org")], issuer).allowed
    assert caa_decision([issue(LE)], issuer).allowed
    assert not caa_decision([issue("other-ca.org")], issuer).allowed


def test_caa_issuer_validates_and_normalizes() -> None:
    assert CaaIssuer(("LE.org.",), account_uri="").account_uri is None
    assert CaaIssuer.of(LE) == CaaIssuer((LE,))
    assert CaaIssuer.of(OURS) is OURS
    assert CaaIssuer(LE).domains == (LE,)  # type: ignore[arg-type]  # a bare str is one domain
    assert OURS.expected == LE
    for bad in ((), ("lets encrypt",), ("",)):
        with pytest.raises(ValueError):
            CaaIssuer(bad)


# --------------------------------------------------------------------------- CAA walk


class FakeCaa:
    """CAA lookups served from a dict; names in ``fail`` raise like a SERVFAIL."""

    def __init__(
        self,
        answers: Mapping[str, CaaAnswerSet] | None = None,
        fail: Sequence[str] = (),
    ) -> None:
        self.answers = dict(answers or {})
        self.fail = set(fail)
        self.asked: list[str] = []

    async def __call__(self, name: str) -> CaaAnswerSet:
        self.asked.append(name)
        if name in self.fail:
            raise DnsLookupError(name, "CAA", "resolver 127.0.0.1:53 answered SERVFAIL")
        return self.answers.get(name, CaaAnswerSet())


def owned(owner: str, *records: CaaRecord) -> CaaAnswerSet:
    """An answer with CAA records owned by ``owner`` and no CNAME."""
    return CaaAnswerSet(caa=[CaaAnswer(owner, r) for r in records])


def aliased(*chain: str, records: Sequence[CaaRecord] = ()) -> CaaAnswerSet:
    """An answer following ``chain[0] → … → chain[-1]``, CAA owned by the last name."""
    cnames = [CnameAnswer(a, b) for a, b in zip(chain, chain[1:])]
    return CaaAnswerSet(cnames=cnames, caa=[CaaAnswer(chain[-1], r) for r in records])


def test_caa_lookup_names() -> None:
    assert caa_lookup_names("shop.eu.acme.test") == [
        "shop.eu.acme.test",
        "eu.acme.test",
        "acme.test",
        "test",
    ]
    assert caa_lookup_names("Shop.Acme.Test.") == ["shop.acme.test", "acme.test", "test"]


async def test_caa_nothing_up_to_tld_permits() -> None:
    lookup = FakeCaa()
    await check_caa("shop.acme.test", LE, lookup)
    assert lookup.asked == ["shop.acme.test", "acme.test", "test"]  # never the root


async def test_caa_hostname_decides_allow() -> None:
    lookup = FakeCaa(
        {
            "shop.acme.test": owned("shop.acme.test", issue(LE)),
            "acme.test": owned("acme.test", issue("other-ca.org")),
        }
    )
    await check_caa("shop.acme.test", LE, lookup)
    assert lookup.asked == ["shop.acme.test", "acme.test", "test"]  # all at once, as Boulder


async def test_caa_hostname_decides_deny() -> None:
    lookup = FakeCaa(
        {
            "shop.acme.test": owned("shop.acme.test", issue("other-ca.org")),
            "acme.test": owned("acme.test", issue(LE)),
        }
    )
    with pytest.raises(DnsCheckError) as info:
        await check_caa("shop.acme.test", LE, lookup)
    error = info.value
    assert error.code is ErrorCode.DNS_CAA
    assert error.message == "CAA at shop.acme.test allows only other-ca.org"
    assert error.found == ['0 issue "other-ca.org"']
    assert error.expected == LE
    assert error.non_retryable


async def test_caa_parent_decides() -> None:
    lookup = FakeCaa(
        {
            "acme.test": owned(
                "acme.test", issue("other-ca.org"), CaaRecord(0, "iodef", "mailto:x@acme.test")
            )
        }
    )
    with pytest.raises(DnsCheckError) as info:
        await check_caa("shop.acme.test", LE, lookup)
    error = info.value
    assert error.code is ErrorCode.DNS_CAA
    assert "CAA at acme.test allows only other-ca.org" in error.message
    assert "shop.acme.test" in error.message
    assert error.found == ['0 issue "other-ca.org"', '0 iodef "mailto:x@acme.test"']
    assert lookup.asked == ["shop.acme.test", "acme.test", "test"]


async def test_caa_parent_allows() -> None:
    lookup = FakeCaa({"test": owned("test", issue(LE))})
    await check_caa("shop.acme.test", LE, lookup)


async def test_caa_iodef_only_rrset_decides_and_permits() -> None:
    lookup = FakeCaa(
        {
            "shop.acme.test": owned("shop.acme.test", CaaRecord(0, "iodef", "mailto:x@y")),
            "acme.test": owned("acme.test", issue("other-ca.org")),
        }
    )
    await check_caa("shop.acme.test", LE, lookup)  # the parent's set is never read


async def test_caa_records_owned_by_a_name_off_the_chain_are_ignored() -> None:
    # CAA records owned by a name the answer never aliases to: not the set of shop.acme.test.
    lookup = FakeCaa(
        {
            "shop.acme.test": owned(TARGET, issue("other-ca.org")),
            "acme.test": owned("acme.test", issue(LE)),
        }
    )
    await check_caa("shop.acme.test", LE, lookup)  # acme.test's set decides


async def test_caa_records_of_the_alias_target_decide() -> None:
    # The same records, reached through the hostname's CNAME: they are its set.
    lookup = FakeCaa(
        {
            "shop.acme.test": aliased("shop.acme.test", TARGET, records=[issue("other-ca.org")]),
            "acme.test": owned("acme.test", issue(LE)),
        }
    )
    with pytest.raises(DnsCheckError) as info:
        await check_caa("shop.acme.test", LE, lookup)
    assert info.value.code is ErrorCode.DNS_CAA
    assert info.value.message == (
        f"CAA at {TARGET} (via shop.acme.test → {TARGET}) allows only other-ca.org"
    )


async def test_caa_chain_in_the_answer_is_followed_from_the_queried_name() -> None:
    # CNAMEs in the answer that do not start at the queried name build no chain.
    answer = CaaAnswerSet(
        cnames=[CnameAnswer("elsewhere.test", TARGET)],
        caa=[CaaAnswer(TARGET, issue("other-ca.org"))],
    )
    lookup = FakeCaa({"shop.acme.test": answer})
    assert await find_caa_set("shop.acme.test", lookup) is None


async def test_caa_alias_loop_in_the_answer_ends() -> None:
    answer = CaaAnswerSet(
        cnames=[CnameAnswer("shop.acme.test", "a.test"), CnameAnswer("a.test", "shop.acme.test")]
    )
    lookup = FakeCaa({"shop.acme.test": answer})
    assert await find_caa_set("shop.acme.test", lookup) is None
    assert lookup.asked == ["shop.acme.test", "acme.test", "test"]


async def test_find_caa_set_returns_the_deciding_set() -> None:
    lookup = FakeCaa(
        {
            "eu.acme.test": aliased(
                "eu.acme.test", "lb.cdn.test", "edge.cdn.test", records=[issue("a-ca.org")]
            ),
            "acme.test": owned("acme.test", issue(LE)),
        }
    )
    found = await find_caa_set("Shop.EU.acme.test.", lookup)
    assert found == CaaSet(
        hostname="shop.eu.acme.test",
        name="eu.acme.test",
        chain=("eu.acme.test", "lb.cdn.test", "edge.cdn.test"),
        records=(issue("a-ca.org"),),
    )
    assert found.owner == "edge.cdn.test"
    assert lookup.asked == ["shop.eu.acme.test", "eu.acme.test", "acme.test", "test"]
    # One walk, several CAs judged.
    verdict = caa_allows(found, LE)
    assert verdict.reason == (
        "CAA at edge.cdn.test (via eu.acme.test → lb.cdn.test → edge.cdn.test) "
        "allows only a-ca.org (applies to shop.eu.acme.test)"
    )
    assert not verdict.allowed
    assert caa_allows(found, CaaIssuer(("a-ca.org",))).allowed


def test_caa_allows_without_any_set() -> None:
    verdict = caa_allows(None, OURS)
    assert verdict.allowed
    assert "no CAA records" in verdict.reason


async def test_caa_owner_compared_case_and_dot_insensitively() -> None:
    lookup = FakeCaa({"shop.acme.test": owned("Shop.ACME.test.", issue("other-ca.org"))})
    with pytest.raises(DnsCheckError) as info:
        await check_caa("SHOP.acme.test.", LE, lookup)
    assert info.value.code is ErrorCode.DNS_CAA


async def test_caa_servfail_is_temporary() -> None:
    lookup = FakeCaa(fail=["acme.test"])
    with pytest.raises(DnsCheckError) as info:
        await check_caa("shop.acme.test", LE, lookup)
    error = info.value
    assert error.code is ErrorCode.ACME_TEMPORARY
    assert "acme.test" in error.message and "SERVFAIL" in error.message
    assert not error.non_retryable
    assert isinstance(error.__cause__, DnsLookupError)


async def test_caa_servfail_above_the_deciding_name_changes_nothing() -> None:
    # Boulder's selectCAA: an error counts only below the first set found.
    lookup = FakeCaa({"shop.acme.test": owned("shop.acme.test", issue(LE))}, fail=["acme.test"])
    await check_caa("shop.acme.test", LE, lookup)
    assert lookup.asked == ["shop.acme.test", "acme.test", "test"]


async def test_caa_servfail_below_an_allowing_set_is_temporary() -> None:
    lookup = FakeCaa({"acme.test": owned("acme.test", issue(LE))}, fail=["shop.acme.test"])
    with pytest.raises(DnsCheckError) as info:
        await check_caa("shop.acme.test", LE, lookup)
    assert info.value.code is ErrorCode.ACME_TEMPORARY


async def test_caa_names_are_looked_up_at_once() -> None:
    """As Boulder's VA (parallelCAALookup): an uncached climb costs one resolver
    round trip, not one per label. Each lookup here answers only once every name
    was asked, so a climb asking one name after another never ends (checked: with
    the lookups awaited in turn, it timed out)."""
    names = caa_lookup_names("shop.eu.acme.test")
    lookup = FakeCaa({"acme.test": owned("acme.test", issue(LE))})
    all_asked = asyncio.Event()

    async def together(name: str) -> CaaAnswerSet:
        answer = await lookup(name)
        if len(lookup.asked) == len(names):
            all_asked.set()
        await all_asked.wait()
        return answer

    found = await asyncio.wait_for(find_caa_set("shop.eu.acme.test", together), timeout=5)
    assert found is not None and found.name == "acme.test"


# --------------------------------------------------------------------------- recorded DNS answers
#
# Each test records the resolver's answers as dnspython messages built from
# text (what `dig` shows) and serves them in place of the network, so the real
# DnsChecker.lookup_caa runs: the query, the rcode handling and the parsing.

HOST = "shop.customer.test"
APEX = "customer.test"
EDGE = "edge.saas.test"


def response(qname: str, qtype: str, *answer: str, rcode: str = "NOERROR") -> dns.message.Message:
    """A resolver's response to ``qname``/``qtype`` with these answer-section lines."""
    lines = "\n".join(answer)
    return dns.message.from_text(
        f"id 4242\nopcode QUERY\nrcode {rcode}\nflags QR RD RA\n"
        f";QUESTION\n{qname}. IN {qtype}\n;ANSWER\n{lines}\n;AUTHORITY\n;ADDITIONAL\n"
    )


class RecordedResolver:
    """Stands in for dnspython's network call; unrecorded names are NXDOMAIN."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: dict[tuple[str, str], dns.message.Message | None] = {}
        self.asked: list[str] = []
        monkeypatch.setattr(dns.asyncquery, "udp_with_fallback", self._exchange)

    def record(self, qname: str, qtype: str, *answer: str, rcode: str = "NOERROR") -> None:
        self.answers[(qname, qtype)] = response(qname, qtype, *answer, rcode=rcode)

    def time_out(self, qname: str, qtype: str) -> None:
        self.answers[(qname, qtype)] = None

    async def _exchange(
        self, query: dns.message.Message, where: str, **kwargs: object
    ) -> tuple[dns.message.Message, bool]:
        question = query.question[0]
        qname = question.name.to_text(omit_final_dot=True)
        qtype = dns.rdatatype.to_text(question.rdtype)
        self.asked.append(f"{qtype} {qname}")
        key = (qname, qtype)
        if key in self.answers and self.answers[key] is None:
            raise dns.exception.Timeout
        answer = self.answers.get(key) or response(qname, qtype, rcode="NXDOMAIN")
        answer.id = query.id
        return answer, False


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> RecordedResolver:
    return RecordedResolver(monkeypatch)


def checker(account_uri: str | None = None) -> DnsChecker:
    return DnsChecker("127.0.0.1:53", EDGE, LE, account_uri=account_uri)


async def recorded_caa_error(hostname: str = HOST, account_uri: str | None = None) -> DnsCheckError:
    dns_checker = checker(account_uri)
    with pytest.raises(DnsCheckError) as info:
        await check_caa(hostname, dns_checker.caa_issuer, dns_checker.lookup_caa)
    return info.value


def test_parse_caa_response_keeps_the_cname_chain() -> None:
    message = response(
        HOST,
        "CAA",
        f"{HOST}. 300 IN CNAME lb.cdn.test.",
        f"lb.cdn.test. 300 IN CNAME {EDGE}.",
        f'{EDGE}. 300 IN CAA 0 issue "digicert.com; foo=bar"',
        f'{EDGE}. 300 IN CAA 128 iodef "mailto:sec@saas.test"',
    )
    assert parse_caa_response(message) == CaaAnswerSet(
        cnames=[CnameAnswer(HOST, "lb.cdn.test"), CnameAnswer("lb.cdn.test", EDGE)],
        caa=[
            CaaAnswer(EDGE, CaaRecord(0, "issue", "digicert.com; foo=bar")),
            CaaAnswer(EDGE, CaaRecord(128, "iodef", "mailto:sec@saas.test")),
        ],
    )


def test_parse_caa_response_odd_bytes_stay_visible() -> None:
    message = response(APEX, "CAA", f'{APEX}. 300 IN CAA 0 issue "le\\255.org"')
    (answer,) = parse_caa_response(message).caa
    assert answer.record.value == "le\\xff.org"
    assert not caa_decision([answer.record], LE).allowed


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ('"digicert.com"', "allows only digicert.com"),
        ('";"', 'forbids all certificate issuance (issue ";")'),
    ],
)
async def test_recorded_edge_set_forbids_through_the_alias(
    resolver: RecordedResolver, value: str, reason: str
) -> None:
    resolver.record(
        HOST, "CAA", f"{HOST}. 300 IN CNAME {EDGE}.", f"{EDGE}. 300 IN CAA 0 issue {value}"
    )
    resolver.record(APEX, "CAA", f'{APEX}. 300 IN CAA 0 issue "letsencrypt.org"')
    error = await recorded_caa_error()
    assert error.code is ErrorCode.DNS_CAA
    assert error.message == f"CAA at {EDGE} (via {HOST} → {EDGE}) {reason}"
    assert error.found == [f"0 issue {value}"]
    assert error.expected == LE
    # The edge's set decides; the apex is asked with it (all at once) but not read.
    assert resolver.asked == [f"CAA {HOST}", f"CAA {APEX}", "CAA test"]


async def test_recorded_edge_allows_although_the_apex_names_another_ca(
    resolver: RecordedResolver,
) -> None:
    resolver.record(
        HOST,
        "CAA",
        f"{HOST}. 300 IN CNAME {EDGE}.",
        f'{EDGE}. 300 IN CAA 0 issue "letsencrypt.org"',
    )
    resolver.record(APEX, "CAA", f'{APEX}. 300 IN CAA 0 issue "sectigo.com"')
    dns_checker = checker()
    verdict = await check_caa(HOST, dns_checker.caa_issuer, dns_checker.lookup_caa)
    assert verdict.allowed
    assert verdict.reason == f"CAA at {EDGE} (via {HOST} → {EDGE}) allows letsencrypt.org"


async def test_recorded_nodata_at_the_edge_climbs_to_the_apex(resolver: RecordedResolver) -> None:
    # The resolver answers the alias chain only: the edge has no CAA RRset.
    resolver.record(HOST, "CAA", f"{HOST}. 300 IN CNAME {EDGE}.")
    resolver.record(
        APEX,
        "CAA",
        f'{APEX}. 300 IN CAA 0 issue "sectigo.com"',
        f'{APEX}. 300 IN CAA 0 iodef "mailto:it@customer.test"',
    )
    error = await recorded_caa_error()
    assert error.code is ErrorCode.DNS_CAA
    assert error.message == f"CAA at {APEX} allows only sectigo.com (applies to {HOST})"
    assert error.found == ['0 issue "sectigo.com"', '0 iodef "mailto:it@customer.test"']


async def test_recorded_two_hop_chain(resolver: RecordedResolver) -> None:
    resolver.record(
        HOST,
        "CAA",
        f"{HOST}. 300 IN CNAME lb.cdn.test.",
        f"lb.cdn.test. 300 IN CNAME {EDGE}.",
        f'{EDGE}. 300 IN CAA 0 issue "digicert.com"',
    )
    error = await recorded_caa_error()
    assert error.message == (
        f"CAA at {EDGE} (via {HOST} → lb.cdn.test → {EDGE}) allows only digicert.com"
    )


async def test_recorded_dname_is_followed_through_its_synthesized_cname(
    resolver: RecordedResolver,
) -> None:
    resolver.record(
        HOST,
        "CAA",
        f"{APEX}. 300 IN DNAME brand.test.",
        f"{HOST}. 300 IN CNAME shop.brand.test.",
        'shop.brand.test. 300 IN CAA 0 issue "digicert.com"',
    )
    error = await recorded_caa_error()
    assert error.message == (
        f"CAA at shop.brand.test (via {HOST} → shop.brand.test) allows only digicert.com"
    )


async def test_recorded_parents_of_the_alias_target_are_never_consulted(
    resolver: RecordedResolver,
) -> None:
    # The edge (outside the hostname's tree) has no CAA; its parent does.
    resolver.record(HOST, "CAA", f"{HOST}. 300 IN CNAME {EDGE}.")
    resolver.record("saas.test", "CAA", 'saas.test. 300 IN CAA 0 issue "digicert.com"')
    resolver.record(APEX, "CAA")
    resolver.record("test", "CAA")
    dns_checker = checker()
    verdict = await check_caa(HOST, dns_checker.caa_issuer, dns_checker.lookup_caa)
    assert verdict.allowed
    assert resolver.asked == [f"CAA {HOST}", f"CAA {APEX}", "CAA test"]


async def test_recorded_caa_owned_off_the_chain_is_ignored(resolver: RecordedResolver) -> None:
    resolver.record(
        HOST,
        "CAA",
        f"{HOST}. 300 IN CNAME {EDGE}.",
        'stray.other.test. 300 IN CAA 0 issue "digicert.com"',
    )
    dns_checker = checker()
    assert (await check_caa(HOST, dns_checker.caa_issuer, dns_checker.lookup_caa)).allowed
    assert resolver.asked == [f"CAA {HOST}", f"CAA {APEX}", "CAA test"]


@pytest.mark.parametrize(
    ("methods", "allowed"),
    [("dns-01", False), ("http-01,dns-01", True), ("dns-01,http-01", True), ("tls-alpn-01", False)],
)
async def test_recorded_validationmethods(
    resolver: RecordedResolver, methods: str, allowed: bool
) -> None:
    resolver.record(
        HOST,
        "CAA",
        f"{HOST}. 300 IN CNAME {EDGE}.",
        f'{EDGE}. 300 IN CAA 0 issue "letsencrypt.org; validationmethods={methods}"',
    )
    dns_checker = checker(ACCOUNT)
    if allowed:
        assert (await check_caa(HOST, dns_checker.caa_issuer, dns_checker.lookup_caa)).allowed
        return
    error = await recorded_caa_error(account_uri=ACCOUNT)
    assert error.code is ErrorCode.DNS_CAA
    assert error.message == (
        f"CAA at {EDGE} (via {HOST} → {EDGE}) allows letsencrypt.org "
        f"only with validationmethods={methods} (we validate with http-01)"
    )


@pytest.mark.parametrize(
    ("ours", "reason"),
    [
        (ACCOUNT, None),
        (OTHER_ACCOUNT, f"only for account {ACCOUNT} (ours is {OTHER_ACCOUNT})"),
        (None, f"only for account {ACCOUNT} (our ACME account URL is not known yet)"),
    ],
)
async def test_recorded_accounturi(
    resolver: RecordedResolver, ours: str | None, reason: str | None
) -> None:
    resolver.record(
        HOST,
        "CAA",
        f"{HOST}. 300 IN CNAME {EDGE}.",
        f'{EDGE}. 300 IN CAA 0 issue "letsencrypt.org; accounturi={ACCOUNT}"',
    )
    if reason is None:
        dns_checker = checker(ours)
        assert (await check_caa(HOST, dns_checker.caa_issuer, dns_checker.lookup_caa)).allowed
        return
    error = await recorded_caa_error(account_uri=ours)
    assert error.code is ErrorCode.DNS_CAA
    assert error.message == f"CAA at {EDGE} (via {HOST} → {EDGE}) allows letsencrypt.org {reason}"
    assert error.found == [f'0 issue "letsencrypt.org; accounturi={ACCOUNT}"']


async def test_recorded_servfail_on_a_parent_is_temporary(resolver: RecordedResolver) -> None:
    resolver.record(HOST, "CAA", f"{HOST}. 300 IN CNAME {EDGE}.")
    resolver.record(APEX, "CAA", rcode="SERVFAIL")
    resolver.record("test", "CAA", 'test. 300 IN CAA 0 issue "letsencrypt.org"')
    error = await recorded_caa_error()
    assert error.code is ErrorCode.ACME_TEMPORARY
    assert error.message == (
        f"CAA lookup for {APEX} failed: resolver 127.0.0.1:53 answered SERVFAIL "
        f"(applies to {HOST})"
    )
    assert error.expected == LE
    assert not error.non_retryable
    assert isinstance(error.__cause__, DnsLookupError)
    # test.'s set, which would allow, is above the failed name: it cannot decide.
    assert resolver.asked == [f"CAA {HOST}", f"CAA {APEX}", "CAA test"]


async def test_recorded_timeout_is_temporary(resolver: RecordedResolver) -> None:
    resolver.time_out(HOST, "CAA")
    error = await recorded_caa_error()
    assert error.code is ErrorCode.ACME_TEMPORARY
    assert "no answer from resolver 127.0.0.1:53" in error.message


async def test_recorded_full_check(resolver: RecordedResolver) -> None:
    resolver.record(HOST, "CNAME", f"{HOST}. 300 IN CNAME {EDGE}.")
    resolver.record(
        HOST, "CAA", f"{HOST}. 300 IN CNAME {EDGE}.", f'{EDGE}. 300 IN CAA 0 issue "digicert.com"'
    )
    with pytest.raises(DnsCheckError) as info:
        await checker().check("Shop.Customer.Test.")
    assert info.value.code is ErrorCode.DNS_CAA
    assert info.value.message == f"CAA at {EDGE} (via {HOST} → {EDGE}) allows only digicert.com"
    assert resolver.asked == [f"CNAME {HOST}", f"CAA {HOST}", f"CAA {APEX}", "CAA test"]


# --------------------------------------------------------------------------- CNAME chain


class FakeCname:
    """CNAME lookups from a dict of owner -> answers; names in ``fail`` raise."""

    def __init__(
        self,
        answers: Mapping[str, Sequence[CnameAnswer]] | None = None,
        fail: Sequence[str] = (),
    ) -> None:
        self.answers = dict(answers or {})
        self.fail = set(fail)
        self.asked: list[str] = []

    async def __call__(self, name: str) -> list[CnameAnswer]:
        self.asked.append(name)
        if name in self.fail:
            raise DnsLookupError(name, "CNAME", "no answer from resolver 127.0.0.1:53 within 10 s")
        return list(self.answers.get(name, []))


def chain(*links: tuple[str, str]) -> FakeCname:
    return FakeCname({owner: [CnameAnswer(owner, target)] for owner, target in links})


async def cname_error(hostname: str, lookup: FakeCname, target: str = TARGET) -> DnsCheckError:
    with pytest.raises(DnsCheckError) as info:
        await follow_cname_chain(hostname, target, lookup)
    error = info.value
    assert error.code is ErrorCode.DNS_CNAME
    assert error.expected == target.lower().rstrip(".")
    return error


async def test_cname_direct_match() -> None:
    lookup = chain(("shop.acme.test", TARGET))
    await follow_cname_chain("shop.acme.test", TARGET, lookup)
    assert lookup.asked == ["shop.acme.test"]


async def test_cname_two_hop_match() -> None:
    lookup = chain(("shop.acme.test", "edge.acme.test"), ("edge.acme.test", TARGET))
    await follow_cname_chain("shop.acme.test", TARGET, lookup)
    assert lookup.asked == ["shop.acme.test", "edge.acme.test"]


async def test_cname_four_lookups_is_the_limit() -> None:
    lookup = chain(
        ("shop.acme.test", "a.test"),
        ("a.test", "b.test"),
        ("b.test", "c.test"),
        ("c.test", TARGET),
    )
    await follow_cname_chain("shop.acme.test", TARGET, lookup)
    assert len(lookup.asked) == 4


async def test_cname_too_long() -> None:
    lookup = chain(
        ("shop.acme.test", "a.test"),
        ("a.test", "b.test"),
        ("b.test", "c.test"),
        ("c.test", "d.test"),
        ("d.test", TARGET),
    )
    error = await cname_error("shop.acme.test", lookup)
    assert "longer than 4" in error.message
    assert error.found == ["a.test", "b.test", "c.test", "d.test"]
    assert len(lookup.asked) == 4


async def test_cname_case_and_trailing_dot_ignored() -> None:
    lookup = FakeCname({"shop.acme.test": [CnameAnswer("SHOP.Acme.Test.", "Custom.SaaS.TEST.")]})
    await follow_cname_chain("Shop.ACME.test.", "custom.saas.test.", lookup)


async def test_cname_mismatch() -> None:
    error = await cname_error("shop.acme.test", chain(("shop.acme.test", "x.other.test")))
    assert error.message == "shop.acme.test is a CNAME to x.other.test; expected custom.saas.test"
    assert error.found == ["x.other.test"]


async def test_cname_chain_ends_elsewhere() -> None:
    lookup = chain(("shop.acme.test", "a.test"), ("a.test", "x.other.test"))
    error = await cname_error("shop.acme.test", lookup)
    assert error.message == (
        "shop.acme.test is a CNAME to a.test -> x.other.test; expected custom.saas.test"
    )
    assert error.found == ["a.test", "x.other.test"]


async def test_cname_none() -> None:
    error = await cname_error("shop.acme.test", FakeCname())
    assert error.message == (
        "shop.acme.test has no CNAME record; expected a CNAME to custom.saas.test"
    )
    assert error.found == []
    assert error.non_retryable


async def test_cname_loop() -> None:
    lookup = chain(("shop.acme.test", "a.test"), ("a.test", "shop.acme.test"))
    error = await cname_error("shop.acme.test", lookup)
    assert "loop" in error.message
    assert "shop.acme.test -> a.test -> shop.acme.test" in error.message


async def test_cname_self_loop() -> None:
    error = await cname_error("shop.acme.test", chain(("shop.acme.test", "Shop.Acme.Test.")))
    assert "loop" in error.message


async def test_cname_multiple_for_one_owner() -> None:
    lookup = FakeCname(
        {
            "shop.acme.test": [
                CnameAnswer("shop.acme.test", TARGET),
                CnameAnswer("shop.acme.test", "x.other.test"),
            ]
        }
    )
    error = await cname_error("shop.acme.test", lookup)
    assert "2 CNAME records" in error.message
    assert error.found == [TARGET, "x.other.test"]


async def test_cname_duplicate_answers_count_once() -> None:
    lookup = FakeCname(
        {
            "shop.acme.test": [
                CnameAnswer("shop.acme.test", TARGET),
                CnameAnswer("shop.acme.test.", TARGET.upper()),
            ]
        }
    )
    await follow_cname_chain("shop.acme.test", TARGET, lookup)


async def test_cname_owner_mismatch() -> None:
    lookup = FakeCname({"shop.acme.test": [CnameAnswer("other.acme.test", TARGET)]})
    error = await cname_error("shop.acme.test", lookup)
    assert "owned by other.acme.test" in error.message
    assert error.found == [f"other.acme.test CNAME {TARGET}"]


async def test_cname_owner_mismatch_later_in_chain() -> None:
    lookup = FakeCname(
        {
            "shop.acme.test": [CnameAnswer("shop.acme.test", "a.test")],
            "a.test": [CnameAnswer("b.test", TARGET)],
        }
    )
    error = await cname_error("shop.acme.test", lookup)
    assert "answer for a.test is owned by b.test" in error.message


async def test_cname_lookup_error_is_dns_cname() -> None:
    error = await cname_error("shop.acme.test", FakeCname(fail=["shop.acme.test"]))
    assert "could not look up" in error.message and "within 10 s" in error.message
    assert isinstance(error.__cause__, DnsLookupError)


async def test_cname_lookup_error_mid_chain() -> None:
    lookup = FakeCname(
        {"shop.acme.test": [CnameAnswer("shop.acme.test", "a.test")]}, fail=["a.test"]
    )
    error = await cname_error("shop.acme.test", lookup)
    assert "a.test" in error.message
    assert error.found == ["a.test"]


# --------------------------------------------------------------------------- DnsChecker wiring


async def test_checker_runs_cname_then_caa() -> None:
    checker = DnsChecker("127.0.0.1:53", "Custom.Saas.Test.", "LetsEncrypt.org")
    assert checker.cname_target == TARGET
    assert checker.caa_issuer_domain == LE
    calls: list[str] = []

    async def fake_cname(name: str) -> list[CnameAnswer]:
        calls.append(f"CNAME {name}")
        return [CnameAnswer(name, TARGET)] if name == "shop.acme.test" else []

    async def fake_caa(name: str) -> CaaAnswerSet:
        calls.append(f"CAA {name}")
        if name == "acme.test":
            return owned("acme.test", issue("other-ca.org"))
        return CaaAnswerSet()

    # Frozen dataclass: patch the instance's lookups through object.__setattr__.
    object.__setattr__(checker, "lookup_cname", fake_cname)
    object.__setattr__(checker, "lookup_caa", fake_caa)
    with pytest.raises(DnsCheckError) as info:
        await checker.check(" Shop.Acme.Test. ")
    assert info.value.code is ErrorCode.DNS_CAA
    assert calls == ["CNAME shop.acme.test", "CAA shop.acme.test", "CAA acme.test", "CAA test"]


def test_checker_builds_the_caa_issuer() -> None:
    checker = DnsChecker("127.0.0.1:53", TARGET, "LetsEncrypt.org.", account_uri=ACCOUNT)
    assert checker.caa_issuer == CaaIssuer((LE,), account_uri=ACCOUNT)
    assert DnsChecker("127.0.0.1:53", TARGET, LE).caa_issuer.account_uri is None
    assert DnsChecker("127.0.0.1:53", TARGET, LE, account_uri="").account_uri is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("127.0.0.1:8053", ("127.0.0.1", 8053)),
        ("127.0.0.1", ("127.0.0.1", 53)),
        ("dns.internal:5353", ("dns.internal", 5353)),
        ("[::1]:8053", ("::1", 8053)),
        ("[::1]", ("::1", 53)),
        ("::1", ("::1", 53)),
    ],
)
def test_parse_resolver_address(spec: str, expected: tuple[str, int]) -> None:
    assert parse_resolver_address(spec) == expected


@pytest.mark.parametrize(
    "spec", ["", ":53", "host:", "host:0", "host:70000", "host:x", "[::1", "[::1]x"]
)
def test_parse_resolver_address_rejects(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_resolver_address(spec)


@pytest.mark.parametrize(
    ("resolver", "target", "issuer"),
    [
        ("nope:", TARGET, LE),
        ("127.0.0.1:53", "not a name", LE),
        ("127.0.0.1:53", TARGET, "lets encrypt"),
        ("127.0.0.1:53", TARGET, ""),
    ],
)
def test_checker_rejects_bad_config(resolver: str, target: str, issuer: str) -> None:
    with pytest.raises(ConfigError):
        DnsChecker(resolver, target, issuer)
