"""normalize_hostname: canonical form for good names, a specific reason for bad ones."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from certflow.hostnames import (
    Hostname,
    InvalidHostnameError,
    InvalidTenantError,
    as_hostname,
    is_wildcard,
    normalize_hostname,
    normalize_tenant_id,
)
from certflow.workflow_payloads import CertificateInput

LABEL_63 = "a" * 63
NAME_253 = ".".join([LABEL_63, LABEL_63, LABEL_63, "a" * 61])
NAME_254 = ".".join([LABEL_63, LABEL_63, LABEL_63, "a" * 62])

GOOD: list[tuple[str, str]] = [
    ("shop.example.com", "shop.example.com"),
    (" Shop.Example.COM. ", "shop.example.com"),
    ("SHOP.EXAMPLE.COM", "shop.example.com"),
    ("trust.customer.com.", "trust.customer.com"),
    ("\tshop.example.com\n", "shop.example.com"),
    ("a.b", "a.b"),
    ("a-b.example.com", "a-b.example.com"),
    ("a--b.example.com", "a--b.example.com"),  # "--" outside positions 3-4 is fine
    ("123.example.com", "123.example.com"),  # numeric labels are fine below the TLD
    ("x1.example.xn--p1ai", "x1.example.xn--p1ai"),
    ("bücher.example", "xn--bcher-kva.example"),
    ("BÜCHER.Example", "xn--bcher-kva.example"),
    ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
    ("xn--bcher-kva.example.", "xn--bcher-kva.example"),
    ("faß.de", "xn--fa-hia.de"),  # non-transitional: ß is kept, not mapped to "ss"
    ("ΣΟΦΟΣ.gr", "xn--0xaakcn.gr"),  # UTS #46 maps capital sigma to σ, not ς
    ("münchen.例え.jp", "xn--mnchen-3ya.xn--r8jz45g.jp"),
    ("пример.рф", "xn--e1afmkfd.xn--p1ai"),
    ("ＷＷＷ.Example.com", "www.example.com"),  # full-width letters map to ASCII
    ("a\u3002example\uff0ecom", "a.example.com"),  # ideographic/full-width dots
    (LABEL_63 + ".example.com", LABEL_63 + ".example.com"),
    (NAME_253, NAME_253),
    (NAME_253 + ".", NAME_253),
]


@pytest.mark.parametrize(("raw", "expected"), GOOD)
def test_good_names_are_normalized(raw: str, expected: str) -> None:
    assert normalize_hostname(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), GOOD)
def test_normalization_is_idempotent(raw: str, expected: str) -> None:
    assert normalize_hostname(expected) == expected


def test_a_hostname_is_validated_once_and_trusted_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``normalize_hostname`` returns is a ``Hostname``, which ``as_hostname`` (the
    client's and the activities' entry) passes on without validating it again; a
    plain ``str`` is validated. Shown red: with ``as_hostname`` normalizing every
    value, the first case counted one validation."""
    validated = normalize_hostname(" Shop.Example.COM. ")
    assert type(validated) is Hostname and validated == "shop.example.com"
    calls: list[str] = []
    real = normalize_hostname

    def counting(raw: str) -> Hostname:
        calls.append(raw)
        return real(raw)

    monkeypatch.setattr("certflow.hostnames.normalize_hostname", counting)
    assert as_hostname(validated) is validated and calls == []
    assert as_hostname("Shop.Example.COM") == "shop.example.com" and calls == ["Shop.Example.COM"]
    with pytest.raises(InvalidHostnameError):
        as_hostname("shop..example.com")


def test_a_hostname_in_a_payload_is_the_json_string_it_always_was() -> None:
    """Payloads carry a ``Hostname`` as a plain JSON string (recorded histories decode
    unchanged) and decode it as a ``Hostname``."""
    payload = CertificateInput(hostname=Hostname("shop.example.com"))
    assert payload.model_dump_json() == CertificateInput.model_validate(
        {"hostname": "shop.example.com"}
    ).model_dump_json()
    assert '"hostname":"shop.example.com"' in payload.model_dump_json()
    decoded = CertificateInput.model_validate_json(payload.model_dump_json())
    assert type(decoded.hostname) is Hostname


# (input, words the reason must contain (all, case-insensitive))
BAD: list[tuple[Any, tuple[str, ...]]] = [
    ("", ("empty",)),
    ("   ", ("empty",)),
    (".", ("empty",)),
    ("1.2.3.4", ("ip address",)),
    ("1.2.3.4.", ("ip address",)),
    ("127.0.0.1", ("ip address",)),
    ("::1", ("ip address",)),
    ("[::1]", ("ip address",)),
    ("[2001:db8::1]:443", ("ip address",)),
    ("2001:db8::1", ("ip address",)),
    ("fe80::1%eth0", ("ip address",)),
    ("1.2.3", ("numeric",)),
    ("example.123", ("numeric",)),
    ("*.com", ("single-label",)),  # a wildcard's base is a hostname too
    ("*.co.uk", ("public suffix",)),  # never directly under a public suffix
    ("*.*.example.com", ("wildcard",)),
    ("a.*.b", ("wildcard",)),
    ("a*.example.com", ("wildcard",)),
    ("＊.com", ("single-label",)),  # full-width asterisk maps to "*"
    ("localhost", ("single-label",)),
    ("LOCALHOST.", ("single-label",)),
    ("com", ("single-label",)),
    ("bücher", ("single-label",)),
    ("a" * 64 + ".example.com", ("64 octets",)),
    ("ü" * 60 + ".example.com", ("octets",)),  # short U-label, over-long A-label
    (NAME_254, ("254 octets",)),
    (NAME_254 + ".", ("254 octets",)),
    ("a_b.example.com", ("underscore",)),
    ("_acme-challenge.example.com", ("underscore",)),
    ("a..b", ("empty label", "consecutive")),
    (".a.b", ("empty label", "leading")),
    ("a.b..", ("empty label", "trailing")),
    ("-a.example.com", ("hyphen", "starts")),
    ("a-.example.com", ("hyphen", "ends")),
    ("shop.-example.com", ("hyphen", "starts")),
    ("ab--cd.example.com", ("3rd and 4th",)),
    ("ex ample.com", ("whitespace",)),
    ("a\tb.com", ("whitespace",)),
    ("a\u00a0b.com", ("whitespace",)),  # no-break space
    ("a\x00b.com", ("nul",)),
    ("a\nb.com", ("whitespace",)),
    ("a\x07b.com", ("control",)),
    ("a\x7fb.com", ("control",)),
    ("'; DROP TABLE certificates;--.com", ("whitespace",)),
    ("';DROP--TABLE.com", ("character \"'\"",)),
    ("$(rm -rf /).com", ("whitespace",)),
    ("$(reboot).com", ("character '$'",)),
    ("`id`.example.com", ("character '`'",)),
    ("a/b.example.com", ("character '/'",)),
    ("user@example.com", ("character '@'",)),
    ("example.com:443", ("character ':'",)),
    ("http://example.com", ("character ':'",)),
    ("x" * 10_000, ("too long",)),
    ("x." * 5_000 + "com", ("too long",)),
    (b"example.com", ("expected str", "bytes")),
    (bytearray(b"example.com"), ("expected str", "bytearray")),
    (None, ("expected str", "NoneType")),
    (123, ("expected str", "int")),
    ("xn--zz.example", ("idna", "xn--zz")),
    ("xn--.example", ("hyphen",)),
    ("xn--a.example", ("idna",)),
    ("xn--ls8h.la", ("idna",)),  # the A-label of an emoji
    ("💩.la", ("idna", "U+1F4A9")),  # emoji are not valid under IDNA 2008
    ("☃.example", ("idna",)),
    ("a\u200db.example", ("idna",)),  # ZWJ outside its allowed context
    ("\u202egoogle.com", ("idna",)),  # right-to-left override
    ("٣.com", ("idna",)),  # bidi rule
]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("*.Shop.Example.com.", "*.shop.example.com"), ("＊.shop.example.com", "*.shop.example.com"),
     ("*.bücher.example", "*.xn--bcher-kva.example")],
)
def test_a_wildcard_is_a_hostname_for_the_dns_methods(raw: str, expected: str) -> None:
    """``*.<name>``: valid (issued over dns-01 or dns-persist-01 only), normalized
    like its base name, and recognized as a wildcard."""
    assert normalize_hostname(raw) == expected
    assert is_wildcard(normalize_hostname(raw))
    assert not is_wildcard(normalize_hostname(raw)[2:])


@pytest.mark.parametrize("raw", ["*.github.io", "*.blogspot.com"])
def test_a_wildcard_under_a_private_suffix_is_allowed(raw: str) -> None:
    """Boulder refuses a wildcard only directly under an ICANN suffix: policy/pa.go
    ``ValidDomain`` compares the base with ``iana.ExtractSuffix``, which ignores the
    list's private section (``github.io``). Red with the full list used (refused
    as "directly under the public suffix"; checked once)."""
    assert normalize_hostname(raw) == raw


def test_bad_table_is_big_enough() -> None:
    assert len(BAD) >= 40


@pytest.mark.parametrize(("raw", "words"), BAD)
def test_bad_names_are_rejected_with_a_reason(raw: Any, words: tuple[str, ...]) -> None:
    with pytest.raises(InvalidHostnameError) as info:
        normalize_hostname(raw)
    error = info.value
    for word in words:
        assert word.lower() in error.reason.lower(), error.reason
    assert isinstance(error.hostname, str)
    assert str(error).endswith(": " + error.reason)


@pytest.mark.parametrize(("raw", "words"), BAD)
def test_messages_are_short_single_lines(raw: Any, words: tuple[str, ...]) -> None:
    with pytest.raises(InvalidHostnameError) as info:
        normalize_hostname(raw)
    message = str(info.value)
    assert "\n" not in message and "\x00" not in message
    assert message.isprintable()
    assert len(message) < 400


def test_message_format() -> None:
    with pytest.raises(InvalidHostnameError) as info:
        normalize_hostname("a..b")
    assert str(info.value) == "invalid hostname 'a..b': empty label (consecutive dots)"
    assert info.value.hostname == "a..b"


def test_long_input_is_truncated_in_message_but_kept_in_attribute() -> None:
    raw = "x" * 10_000
    with pytest.raises(InvalidHostnameError) as info:
        normalize_hostname(raw)
    assert info.value.hostname == raw
    assert f"'{'x' * 60}'..." in str(info.value)
    assert "x" * 61 not in str(info.value)
    assert "10000" in str(info.value)


def test_is_a_value_error_and_pickles() -> None:
    with pytest.raises(ValueError):
        normalize_hostname("a..b")
    error = InvalidHostnameError("a..b", "empty label")
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.hostname, clone.reason, str(clone)) == (error.hostname, error.reason, str(error))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [("", "empty"), ("  ", "empty"), ("a\x00b", "U+0000"), ("a\nb", "U+000A"), ("t" * 201, "longer than 200")],
)
def test_a_bad_tenant_id_is_refused_with_a_reason(raw: str, reason: str) -> None:
    with pytest.raises(InvalidTenantError) as raised:
        normalize_tenant_id(raw)
    assert reason in str(raised.value) and "\n" not in str(raised.value)


def test_a_tenant_id_is_kept_as_the_product_wrote_it() -> None:
    assert normalize_tenant_id("  Tenant-42/ü ") == "Tenant-42/ü"
