"""DNS pre-checks (SPEC §3.1) with fake lookups: CAA decisions, the CAA walk, the CNAME chain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from activities.dns_checks import (
    CaaAnswer,
    CaaRecord,
    CnameAnswer,
    DnsChecker,
    DnsLookupError,
    caa_decision,
    caa_lookup_names,
    check_caa,
    follow_cname_chain,
    parse_resolver_address,
)
from certflow.errors import ConfigError, DnsCheckError, ErrorCode

LE = "letsencrypt.org"
TARGET = "custom.saas.test"


def issue(value: str, flags: int = 0) -> CaaRecord:
    return CaaRecord(flags, "issue", value)


# --------------------------------------------------------------------------- caa_decision


ALLOWED_CASES: list[tuple[str, list[CaaRecord]]] = [
    ("issue match", [issue(LE)]),
    ("one of several issuers", [issue("other-ca.org"), issue(LE)]),
    ("issuer case-insensitive", [issue("LetsEncrypt.ORG")]),
    ("tag case-insensitive", [CaaRecord(0, "ISSUE", LE)]),
    ("tag mixed case", [CaaRecord(0, "IsSuE", LE)]),
    ("parameters after ;", [issue(f"{LE}; accounturi=https://acme.example/acct/1")]),
    ("several parameters", [issue(f"{LE}; a=1; validationmethods=http-01")]),
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
    ("empty issuer ';'", [issue(";")], "forbids all"),
    ("empty value", [issue("")], "forbids all"),
    ("';' with parameters", [issue("; a=b")], "forbids all"),
    ("malformed value", [issue("letsencrypt.org/x")], "malformed"),
    ("issuer with trailing dot", [issue("letsencrypt.org.")], "malformed"),
    ("issuer label starts with hyphen", [issue("-letsencrypt.org")], "malformed"),
    ("issuer with space inside", [issue("letsencrypt .org")], "malformed"),
    ("bad parameter (no =)", [issue(f"{LE}; accounturi")], "malformed"),
    ("bad parameter tag", [issue(f"{LE}; bad_tag=1")], "malformed"),
    ("bad parameter value", [issue(f"{LE}; a=b c")], "malformed"),
    ("trailing ; after parameter", [issue(f"{LE}; a=b;")], "malformed"),
    ("superdomain of issuer", [issue("org")], "allows only org"),
    ("subdomain of issuer", [issue(f"ca.{LE}")], f"allows only ca.{LE}"),
    ("';' plus other issuer", [issue(";"), issue("other-ca.org")], "allows only other-ca.org"),
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


# --------------------------------------------------------------------------- CAA walk


class FakeCaa:
    """CAA lookups served from a dict; names in ``fail`` raise like a SERVFAIL."""

    def __init__(
        self,
        answers: Mapping[str, Sequence[CaaAnswer]] | None = None,
        fail: Sequence[str] = (),
    ) -> None:
        self.answers = dict(answers or {})
        self.fail = set(fail)
        self.asked: list[str] = []

    async def __call__(self, name: str) -> list[CaaAnswer]:
        self.asked.append(name)
        if name in self.fail:
            raise DnsLookupError(name, "CAA", "resolver 127.0.0.1:53 answered SERVFAIL")
        return list(self.answers.get(name, []))


def owned(owner: str, *records: CaaRecord) -> list[CaaAnswer]:
    return [CaaAnswer(owner, r) for r in records]


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
    assert lookup.asked == ["shop.acme.test"]


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
    assert lookup.asked == ["shop.acme.test", "acme.test"]


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
    await check_caa("shop.acme.test", LE, lookup)
    assert lookup.asked == ["shop.acme.test"]


async def test_caa_records_owned_by_another_name_are_ignored() -> None:
    # A resolver chasing the hostname's CNAME returns the target's CAA records.
    lookup = FakeCaa(
        {
            "shop.acme.test": owned(TARGET, issue("other-ca.org")),
            "acme.test": owned("acme.test", issue(LE)),
        }
    )
    await check_caa("shop.acme.test", LE, lookup)
    assert lookup.asked == ["shop.acme.test", "acme.test"]


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


async def test_caa_servfail_after_decision_is_not_reached() -> None:
    lookup = FakeCaa({"shop.acme.test": owned("shop.acme.test", issue(LE))}, fail=["acme.test"])
    await check_caa("shop.acme.test", LE, lookup)


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

    async def fake_caa(name: str) -> list[CaaAnswer]:
        calls.append(f"CAA {name}")
        return owned("acme.test", issue("other-ca.org")) if name == "acme.test" else []

    # Frozen dataclass: patch the instance's lookups through object.__setattr__.
    object.__setattr__(checker, "lookup_cname", fake_cname)
    object.__setattr__(checker, "lookup_caa", fake_caa)
    with pytest.raises(DnsCheckError) as info:
        await checker.check(" Shop.Acme.Test. ")
    assert info.value.code is ErrorCode.DNS_CAA
    assert calls == ["CNAME shop.acme.test", "CAA shop.acme.test", "CAA acme.test"]


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
