"""Hostname validation and normalization (docs/using.md: IDNA A-label, lower case, no trailing dot).

Every hostname that reaches the database, DNS or the CA goes through
:func:`normalize_hostname` once, at the edge where it enters (the command line,
:class:`~certflow.product.client.CertflowClient`, reconcile for rows a product inserted
by SQL, ``ensure_certificate`` for a workflow a backend started itself), and is a
:class:`Hostname` from then on: the layers below take that type and trust it.
"""

from __future__ import annotations

from certflow.errors import CertflowError
import functools
import ipaddress
import reprlib
import string
import unicodedata
from collections.abc import Callable
from typing import Any

import idna
from publicsuffixlist import PublicSuffixList
from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = [
    "Hostname",
    "InvalidHostnameError",
    "InvalidTenantError",
    "normalize_tenant_id",
    "is_wildcard",
    "normalize_hostname",
    "as_hostname",
    "registered_domain",
    "MAX_NAME_OCTETS",
    "MAX_LABEL_OCTETS",
]

MAX_NAME_OCTETS = 253
"""Longest name in presentation form without the trailing dot (RFC 1035 §2.3.4)."""

MAX_LABEL_OCTETS = 63

# Raw inputs longer than this are refused before any IDNA work, so a hostile
# multi-kilobyte string costs nothing. It is deliberately looser than 253:
# UTS #46 can shrink a name (e.g. it drops soft hyphens), so the exact limit is
# enforced on the converted A-label form.
_MAX_RAW_CHARS = 1024

_PREVIEW_CHARS = 60
_LDH = frozenset(string.ascii_lowercase + string.digits + "-")


def _preview(text: str) -> str:
    """A short, single-line, escaped rendering of untrusted input for messages."""
    if len(text) <= _PREVIEW_CHARS:
        return repr(text)
    return f"{text[:_PREVIEW_CHARS]!r}... ({len(text)} chars)"


def _short(text: str, limit: int = 120) -> str:
    """Bound and escape a library message that may quote the (untrusted) input."""
    text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


class InvalidHostnameError(CertflowError, ValueError):
    """A hostname that cannot be used: not a valid, public, DNS host name.

    ``hostname`` is the raw input (always a ``str``; other types are rendered);
    ``reason`` says what is wrong. ``str()`` quotes at most 60 characters of
    the input, escaped, so hostile input stays short and on one line in logs.
    """

    hostname: str
    reason: str

    def __init__(self, hostname: str, reason: str) -> None:
        self.hostname = hostname
        self.reason = reason
        super().__init__(f"invalid hostname {_preview(hostname)}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        # ValueError pickles as cls(*args); our args would be the message alone.
        return (type(self), (self.hostname, self.reason))


class Hostname(str):
    """A hostname in its one canonical spelling, already validated.

    Made by :func:`normalize_hostname` (or :func:`as_hostname`) from input at an
    edge, so a function that takes a ``Hostname`` need not check it again, and mypy
    refuses a bare ``str`` there. Decoded from our own payloads and rows without a
    second check (the workflow sandbox runs no IDNA): a workflow a backend started
    with a name of its own is checked by its first step, ``ensure_certificate``.
    """

    __slots__ = ()

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(cls, core_schema.str_schema())


def as_hostname(value: str) -> Hostname:
    """``value`` itself when it is a :class:`Hostname` already, else normalized
    (:class:`InvalidHostnameError` when it cannot be)."""
    return value if isinstance(value, Hostname) else normalize_hostname(value)


def normalize_hostname(raw: str) -> Hostname:
    """Return the canonical form of ``raw``: IDNA 2008 A-labels, lower case, no trailing dot.

    Surrounding whitespace and one trailing dot are dropped; Unicode is mapped
    with UTS #46 (non-transitional, so ``ß`` stays ``ß``) and encoded to
    A-labels. A wildcard is ``*.`` and such a name (not a public suffix): valid for
    the DNS validation methods only. Raises :class:`InvalidHostnameError` for
    anything that is not a multi-label DNS host name: IP literals, a ``*`` elsewhere,
    empty or over-long labels, characters outside letters/digits/hyphen, invalid
    IDNA, etc.
    """
    if not isinstance(raw, str):
        rendered = (
            raw.decode("ascii", "backslashreplace")
            if isinstance(raw, (bytes, bytearray))
            else reprlib.repr(raw)
        )
        raise InvalidHostnameError(rendered, f"expected str, got {type(raw).__name__}")

    def fail(reason: str) -> InvalidHostnameError:
        return InvalidHostnameError(raw, reason)

    name = raw.strip()
    if not name:
        raise fail("empty")
    if len(name) > _MAX_RAW_CHARS:
        raise fail(f"name is too long ({len(name)} characters; at most {MAX_NAME_OCTETS} octets)")

    # Checked before UTS #46 mapping, which would otherwise report these as an
    # obscure "disallowed code point" (or silently drop some of them).
    for pos, char in enumerate(name):
        if char == "\x00":
            raise fail(f"contains a NUL character at position {pos}")
        if char.isspace():
            raise fail(f"contains whitespace (U+{ord(char):04X}) at position {pos}")
        if unicodedata.category(char) == "Cc":
            raise fail(f"contains a control character (U+{ord(char):04X}) at position {pos}")

    try:
        # std3_rules=False: let "_", "*", ":" etc. through the mapping so the
        # checks below can name the actual problem; they reject them anyway.
        # transitional=False: IDNA 2008 semantics (ß, ς, ZWJ are not remapped).
        mapped = idna.uts46_remap(name, std3_rules=False, transitional=False)
    except idna.IDNAError as exc:
        raise fail(f"invalid IDNA: {_short(str(exc))}") from None

    # Checks on the mapped text, so full-width look-alikes (＊, １) are caught too.
    if mapped.startswith("*.") and "*" not in mapped[2:]:
        return _wildcard(raw, mapped[2:], fail)
    if "*" in mapped:
        raise fail("a wildcard is only allowed as the whole first label (*.shop.example.com)")
    if mapped.startswith("[") or _is_ip_literal(mapped):
        raise fail("IP address literals are not allowed")

    if mapped.endswith("."):
        mapped = mapped[:-1]
    labels = mapped.split(".")
    for index, label in enumerate(labels):
        if not label:
            if index == 0:
                where = "leading dot"
            elif index == len(labels) - 1:
                where = "more than one trailing dot"
            else:
                where = "consecutive dots"
            raise fail(f"empty label ({where})")
    if len(labels) == 1:
        raise fail("single-label names are not allowed (need a dot, e.g. name.example.com)")

    a_labels = [_to_a_label(label, fail) for label in labels]

    if a_labels[-1].isdigit():
        # Browsers (WHATWG URL) parse a name ending in a number as IPv4.
        raise fail(f"top-level label {a_labels[-1]!r} is numeric (looks like an IP address)")

    result = ".".join(a_labels)
    if len(result) > MAX_NAME_OCTETS:
        raise fail(f"name is {len(result)} octets long; at most {MAX_NAME_OCTETS} allowed")
    return Hostname(result)


_Fail = Callable[[str], InvalidHostnameError]


def _wildcard(raw: str, base: str, fail: _Fail) -> Hostname:
    """``*.<base>``: valid for the DNS validation methods (RFC 8555 §7.1.3), never
    directly under an ICANN public suffix (a CA refuses ``*.com`` or ``*.co.uk``).
    A private entry of the list is no bar (``*.github.io``), as Boulder's
    policy/pa.go ``ValidDomain`` compares the base with ``iana.ExtractSuffix``,
    which reads the ICANN section only."""
    try:
        name = normalize_hostname(base)
    except InvalidHostnameError as err:
        raise fail(f"after '*.': {err.reason}") from None
    if _icann_suffix_list().is_public(name):
        raise fail(f"a wildcard directly under the public suffix {name!r} is not allowed")
    if len(name) + 2 > MAX_NAME_OCTETS:
        raise fail(f"name is {len(name) + 2} octets long; at most {MAX_NAME_OCTETS} allowed")
    return Hostname(f"*.{name}")


MAX_TENANT_CHARS = 200


class InvalidTenantError(CertflowError, ValueError):
    """A tenant id that cannot be stored: empty, over-long, or with control characters."""

    def __init__(self, tenant_id: str, reason: str) -> None:
        self.tenant_id = tenant_id
        self.reason = reason
        super().__init__(f"invalid tenant {_preview(tenant_id)}: {reason}")


def normalize_tenant_id(raw: str) -> str:
    """A tenant id as stored: the product's opaque string, surrounding whitespace
    dropped; refused when empty, over :data:`MAX_TENANT_CHARS` characters, or holding
    a control character (it is shown in events, webhooks and logs)."""
    if not isinstance(raw, str):
        raise InvalidTenantError(reprlib.repr(raw), f"expected str, got {type(raw).__name__}")
    value = raw.strip()
    if not value:
        raise InvalidTenantError(raw, "empty")
    if len(value) > MAX_TENANT_CHARS:
        raise InvalidTenantError(raw, f"longer than {MAX_TENANT_CHARS} characters ({len(value)})")
    for position, char in enumerate(value):
        if unicodedata.category(char) in ("Cc", "Cs", "Cn") or char in "\u2028\u2029":
            raise InvalidTenantError(raw, f"contains U+{ord(char):04X} at position {position}")
    return value


def is_wildcard(hostname: str) -> bool:
    """A normalized hostname that is a wildcard (``*.shop.example.com``)."""
    return hostname.startswith("*.")


def _is_ip_literal(text: str) -> bool:
    candidate = text[:-1] if text.endswith(".") else text
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True


def _to_a_label(label: str, fail: _Fail) -> str:
    """Validate one UTS #46-mapped label and return its A-label form."""
    if label.isascii():
        for char in label:
            if char not in _LDH:
                what = "an underscore" if char == "_" else f"the character {char!r}"
                raise fail(
                    f"label {_preview(label)} contains {what}; "
                    "only letters, digits and hyphens are allowed"
                )
        if len(label) > MAX_LABEL_OCTETS:
            raise fail(f"label is {len(label)} octets long; at most {MAX_LABEL_OCTETS} allowed")
        if label.startswith("-"):
            raise fail(f"label {_preview(label)} starts with a hyphen")
        if label.endswith("-"):
            raise fail(f"label {_preview(label)} ends with a hyphen")
        if label.startswith("xn--"):
            _check_a_label(label, fail)
        elif label[2:4] == "--":
            # RFC 5891 §4.2.3.1: "??--" is reserved for IDNA prefixes; CAs refuse it.
            raise fail(
                f"label {_preview(label)} has hyphens in the 3rd and 4th positions (reserved)"
            )
        return label

    # Checked first so an over-long label gets the same message as an ASCII one.
    octets = len("xn--") + len(label.encode("punycode"))
    if octets > MAX_LABEL_OCTETS:
        raise fail(
            f"label is {octets} octets long as an A-label; at most {MAX_LABEL_OCTETS} allowed"
        )
    try:
        encoded = idna.alabel(label).decode("ascii")
    except idna.IDNAError as exc:
        raise fail(f"invalid IDNA label {_preview(label)}: {_short(str(exc))}") from None
    return encoded


def _check_a_label(label: str, fail: _Fail) -> None:
    """Reject an ``xn--`` label that does not decode to a valid IDNA 2008 U-label."""
    try:
        u_label = idna.ulabel(label)
        # Round-trip: rejects non-canonical Punycode that still decodes.
        canonical = idna.alabel(u_label).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise fail(f"invalid IDNA A-label {_preview(label)}: {_short(str(exc))}") from None
    if canonical != label:
        raise fail(
            f"invalid IDNA A-label {_preview(label)}: not in canonical form "
            f"(expected {canonical!r})"
        )


@functools.cache
def _icann_suffix_list() -> PublicSuffixList:
    # The ICANN section alone, as Boulder's iana.ExtractSuffix (an unlisted TLD
    # still counts, so that *.test is refused and *.shop.test is not).
    return PublicSuffixList(accept_unknown=True, only_icann=True)


@functools.cache
def _public_suffix_list() -> PublicSuffixList:
    # The list the package ships (no network); both sections, and an unlisted TLD
    # is a suffix of its own, as Boulder's publicsuffix.DefaultFindOptions.
    return PublicSuffixList(accept_unknown=True, only_icann=False)


def registered_domain(hostname: str) -> str:
    """The registered domain of a (normalized) hostname: its public suffix plus one
    label, as Let's Encrypt scopes "New Certificates per Registered Domain".

    ``a.b.example.co.uk`` → ``example.co.uk``. A hostname that is itself a public
    suffix (``co.uk``, ``github.io``) or has no registrable part is returned as it is.

    Matches Boulder: ``ratelimits/utilities.go`` (``coveringIdentifier``) calls
    weppos/publicsuffix-go's ``publicsuffix.Domain``, i.e. ``DefaultList`` with
    ``DefaultFindOptions`` (``IgnorePrivate: false``, ``DefaultRule: "*"``): the
    ICANN *and* the private sections of the Public Suffix List, so
    ``x.github.io`` → ``x.github.io``, and an unlisted TLD counts as a suffix; a
    name that is a suffix itself is kept whole. (Boulder reads ICANN only for its
    TLD check, ``iana.ExtractSuffix``, not for rate limits.)
    """
    name = hostname.strip().rstrip(".").lower()
    found = _public_suffix_list().privatesuffix(name)
    return found if found is not None else name


def parse_host_port(value: str, *, default_host: str | None = None) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[::1]:53``); the port is mandatory."""
    value = value.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text:
        raise ValueError(f"expected host:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        if default_host is None:
            raise ValueError(f"expected host:port, got {value!r}")
        host = default_host
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port must be a number in {value!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {value!r}")
    return host, port
