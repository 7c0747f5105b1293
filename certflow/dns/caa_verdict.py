"""Whether the CAA set that decides for a hostname lets a CA issue, and why, as
Let's Encrypt's Boulder decides it (``va/caa.go``).

Issuer domains compare exactly, as Boulder compares them; RFC 8657
``accounturi`` and ``validationmethods`` apply. :func:`allowed_issuers` judges
one climb (``caa_climb``) for every configured CA.

The decisions are pure functions over plain data or over an injected lookup, so
they are unit-testable without DNS. Failures are
:class:`~certflow.errors.DnsCheckError` with code ``DNS_CAA`` or, for a failed
lookup, ``ACME_TEMPORARY`` (docs/lifecycle.md, "Statuses and errors").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from certflow.dns.caa_climb import CaaLookup, CaaSet, caa_reading, find_caa_set
from certflow.dns.caa_records import (
    ISSUER_DOMAIN_RE,
    CaaRecord,
    IssueValue,
    escape_character_string,
    parse_issue_value,
)
from certflow.dns.lookup import canonical as _canonical, unique as _unique
from certflow.errors import DnsCheckError, ErrorCode

VALIDATION_METHOD = "http-01"
"""The ACME challenge certflow validates with (RFC 8657 ``validationmethods``)."""
# Property tags the CA understands. Anything else is "unknown", and an unknown
# tag marked critical forbids issuance (RFC 8659 §4.1). This is Boulder's list
# (``filterCAA``): RFC 8659's three plus issuemail (RFC 9495) and issuevmc
# (BIMI). contactemail/contactphone (CA/B Forum BR) are *not* on it, so a
# critical one makes Let's Encrypt refuse, and it makes us refuse too.
_KNOWN_CAA_TAGS = frozenset({"issue", "issuewild", "iodef", "issuemail", "issuevmc"})

# RFC 8657 §4: validationmethods = [*(label ",") label], label = 1*(ALPHA / DIGIT / "-").
_METHOD_RE = re.compile(r"[A-Za-z0-9-]+")

_PREVIEW_CHARS = 60
_PARAM_PREVIEW_CHARS = 100


@dataclass(frozen=True)
class CaaIssuer:
    """A CA as CAA sees it: its issuer domains and, once known, our account URL.

    ``domains`` are the CA's CAA issuer-domain-names (e.g. ``("letsencrypt.org",)``),
    normalized when configured (lower case, no trailing dot); a CAA value's
    issuer-domain must equal one byte for byte, as Boulder compares them
    (``LetsEncrypt.org`` is another issuer). ``account_uri`` is our
    ACME account URL at that CA (RFC 8657 ``accounturi`` is compared to it
    exactly); ``None`` while unknown, and then a value restricted to an account
    authorizes nothing. Raises ``ValueError`` for no domain or a malformed one.
    """

    domains: tuple[str, ...]
    account_uri: str | None = None

    def __post_init__(self) -> None:
        raw: Iterable[str] = (
            (self.domains,) if isinstance(self.domains, str) else self.domains
        )
        domains = tuple(_unique(_canonical(d) for d in raw))
        if not domains:
            raise ValueError("a CAA issuer needs at least one issuer domain")
        for domain in domains:
            if not ISSUER_DOMAIN_RE.fullmatch(domain):
                raise ValueError(f"{domain!r} is not a valid RFC 8659 issuer-domain-name")
        object.__setattr__(self, "domains", domains)
        object.__setattr__(self, "account_uri", self.account_uri or None)

    @classmethod
    def of(cls, issuer: CaaIssuer | str) -> CaaIssuer:
        """``issuer`` itself, or a bare issuer domain with no known account."""
        return issuer if isinstance(issuer, CaaIssuer) else cls((issuer,))

    @property
    def expected(self) -> str:
        """For ``DnsCheckError.expected``: the issuer domains, comma-separated."""
        return ", ".join(self.domains)


@dataclass(frozen=True)
class CaaVerdict:
    """Whether a CAA RRset lets the configured issuer issue, and why (for humans)."""

    allowed: bool
    reason: str


def _quote(text: str) -> str:
    """Untrusted DNS data, rendered short and escaped for messages."""
    if len(text) <= _PREVIEW_CHARS:
        return repr(text)
    return f"{text[:_PREVIEW_CHARS]!r}..."


def _short(text: str) -> str:
    """A parameter value (printable ASCII by then), cut short for messages."""
    if len(text) <= _PARAM_PREVIEW_CHARS:
        return text
    return f"{text[:_PARAM_PREVIEW_CHARS]}..."


def _param_values(value: IssueValue, tag: str) -> list[str]:
    # Parameter tags compare exactly, as Boulder does (``c.tag == "accounturi"``):
    # RFC 8657 defines them in lower case; "AccountURI" is an unknown parameter.
    return [v for t, v in value.params if t == tag]


def _account_refusal(value: IssueValue, issuer: CaaIssuer) -> str | None:
    """Why the RFC 8657 ``accounturi`` parameter refuses us, or ``None`` if it does not."""
    uris = _param_values(value, "accounturi")
    if not uris:
        return None
    if len(uris) > 1:
        # Boulder: a property with several accounturi parameters is unsatisfiable.
        return f"with {len(uris)} accounturi parameters, which no account satisfies"
    uri = uris[0]
    if issuer.account_uri is None:
        return f"only for account {_short(uri)} (our ACME account URL is not known yet)"
    if uri not in account_uri_forms(issuer.account_uri):  # exact strings, as Boulder
        return f"only for account {_short(uri)} (ours is {_short(issuer.account_uri)})"
    return None


_ACCT_URL = re.compile(r"(https?://)([^/]+)/acme/acct/([0-9]+)")
_ACMEV1_HOSTS = {"acme-v02.api.letsencrypt.org": "acme-v01.api.letsencrypt.org",
                 "acme-staging-v02.api.letsencrypt.org": "acme-staging.api.letsencrypt.org"}


def account_uri_forms(account_uri: str) -> frozenset[str]:
    """The accounturi values a CA takes as our account: its URL, and the legacy
    ``/acme/reg/<id>`` form of the same id. Boulder's caaAccountURIMatches accepts
    any of its ``accountURIPrefixes`` followed by the account's id; Let's
    Encrypt's are its ACMEv2 ``…/acme/acct/`` and ACMEv1 ``…/acme/reg/`` URLs."""
    found = _ACCT_URL.fullmatch(account_uri)
    if found is None:
        return frozenset({account_uri})
    scheme, host, account_id = found.groups()
    hosts = {host, _ACMEV1_HOSTS.get(host, host)}
    return frozenset({account_uri, *(f"{scheme}{h}/acme/reg/{account_id}" for h in hosts)})


def _method_refusal(value: IssueValue, ours: str = VALIDATION_METHOD) -> str | None:
    """Why the RFC 8657 ``validationmethods`` parameter refuses the method ``ours``,
    or ``None``."""
    lists = _param_values(value, "validationmethods")
    if not lists:
        return None
    if len(lists) > 1:
        # Boulder treats several validationmethods parameters as unsatisfiable.
        return f"with {len(lists)} validationmethods parameters, which no method satisfies"
    methods = lists[0]
    # As Boulder's caaValidationMethodMatches: in order, a malformed label
    # refuses, ours allows, other (even unknown) methods are skipped.
    for method in methods.split(","):
        if not _METHOD_RE.fullmatch(method):
            return (
                f"only with validationmethods={_short(methods)} "
                "(malformed, so it allows no method)"
            )
        if method == ours:
            return None
    return f"only with validationmethods={_short(methods)} (we validate with {ours})"


# --------------------------------------------------------------------------- pure decisions


def _decide(
    records: Sequence[CaaRecord],
    issuer: CaaIssuer,
    where: str,
    wildcard: bool,
    method: str = VALIDATION_METHOD,
) -> CaaVerdict:
    """RFC 8659 §4 / RFC 8657 over one non-empty RRset; ``where`` starts the reason."""
    for record in records:
        if record.tag.lower() not in _KNOWN_CAA_TAGS and record.critical:
            return CaaVerdict(
                False,
                f"{where} has an unknown critical property {_quote(record.tag)} "
                f"(flags {record.flags}), which forbids issuance",
            )

    tag = "issue"
    relevant = [r for r in records if r.tag.lower() == "issue"]
    if wildcard:
        wild = [r for r in records if r.tag.lower() == "issuewild"]
        if wild:
            tag, relevant = "issuewild", wild
    if not relevant:
        return CaaVerdict(True, f"{where} has no {tag} records, so any CA may issue")

    named: list[str] = []
    malformed: list[str] = []
    empty: list[str] = []
    # Our issuer domains that a value names but whose RFC 8657 parameters refuse us.
    refused: dict[str, list[str]] = {}
    for record in relevant:
        parsed = parse_issue_value(record.value)
        if parsed is None:
            malformed.append(record.value)
        elif parsed.issuer in issuer.domains:
            conditions = [
                c for c in (_account_refusal(parsed, issuer), _method_refusal(parsed, method)) if c
            ]
            if not conditions:
                return CaaVerdict(True, f"{where} allows {parsed.issuer}")
            refused.setdefault(parsed.issuer, []).append(" and ".join(conditions))
        elif parsed.issuer:
            named.append(parsed.issuer)
        else:
            # An explicit "no CA" (";"): authorizes nobody.
            empty.append(record.value)

    others = ", ".join(_unique(named))
    # Ours in another case: say why it does not count, as it surprises people.
    cased = [d for d in _unique(named) if d.lower() in issuer.domains]
    if cased:
        others += (
            f" (issuer domains compare exactly, as at the CA: {cased[0]}"
            f" is not {cased[0].lower()})"
        )
    if refused:
        reason = f"{where} " + "; ".join(
            f"allows {domain} " + ", or ".join(_unique(conditions))
            for domain, conditions in refused.items()
        )
        if others:
            reason += f"; otherwise it allows only {others}"
    elif named:
        reason = f"{where} allows only {others}"
    elif empty:
        shown = escape_character_string(empty[0])
        reason = f'{where} forbids all certificate issuance ({tag} "{shown}")'
    else:
        reason = f"{where} has only malformed {tag} values, which authorize no CA"
    if malformed:
        reason += f" (malformed: {', '.join(_quote(v) for v in _unique(malformed))})"
    return CaaVerdict(False, reason)


def caa_decision(
    records: Sequence[CaaRecord],
    issuer: CaaIssuer | str,
    *,
    owner: str = "",
    wildcard: bool = False,
) -> CaaVerdict:
    """Decide whether a non-empty CAA RRset authorizes ``issuer`` (RFC 8659, RFC 8657).

    ``issuer`` is a :class:`CaaIssuer` or a bare issuer domain (no account
    known). ``owner`` is the name the RRset belongs to; it only appears in the
    reason. ``wildcard`` selects ``issuewild`` semantics (it takes precedence
    over ``issue`` when present); for ordinary names ``issuewild`` is ignored.
    """
    where = f"CAA at {_canonical(owner)}" if owner else "CAA"
    return _decide(records, CaaIssuer.of(issuer), where, wildcard)


def caa_allows(
    found: CaaSet | None,
    issuer: CaaIssuer | str,
    *,
    wildcard: bool = False,
    method: str = VALIDATION_METHOD,
) -> CaaVerdict:
    """Judge the deciding CAA set :func:`find_caa_set` returned for one CA.

    ``None`` (no CAA RRset up to the TLD) permits. The reason names where the
    set was found and through which alias, e.g. ``CAA at edge.saas.com (via
    shop.customer.com → edge.saas.com) allows only digicert.com``, and for a
    parent's set ``… (applies to shop.customer.com)``.
    """
    if found is None:
        return CaaVerdict(True, "no CAA records up to the TLD, so any CA may issue")
    verdict = _decide(found.records, CaaIssuer.of(issuer), found.location, wildcard, method)
    if found.name != found.hostname:
        return CaaVerdict(verdict.allowed, f"{verdict.reason} (applies to {found.hostname})")
    return verdict


async def check_caa(
    hostname: str, issuer: CaaIssuer | str, lookup: CaaLookup
) -> CaaVerdict:
    """Raise unless CAA lets ``issuer`` issue for ``hostname``; the verdict otherwise.

    :func:`find_caa_set` then :func:`caa_allows`. ``issuer`` is a
    :class:`CaaIssuer` or a bare issuer domain. Raises ``DnsCheckError(DNS_CAA)``
    when denied (``found`` lists the deciding records) and
    ``DnsCheckError(ACME_TEMPORARY)`` when a lookup fails.
    """
    caa_issuer = CaaIssuer.of(issuer)
    try:
        found = await find_caa_set(hostname, lookup)
    except DnsCheckError as err:
        err.expected = caa_issuer.expected
        raise
    verdict = caa_allows(found, caa_issuer)
    if not verdict.allowed:
        assert found is not None  # no set at all permits
        raise DnsCheckError(
            ErrorCode.DNS_CAA,
            verdict.reason,
            found=[r.to_text() for r in found.records],
            expected=caa_issuer.expected,
        )
    return verdict


@dataclass(frozen=True)
class IssuersAllowed:
    """What one CAA walk allows: issuer names in order, the reason for the first,
    and the deciding set as read (:func:`caa_reading`)."""

    names: list[str]
    reason: str
    reading: str
    method: str = VALIDATION_METHOD
    """The validation method CAA was judged for (the first one it allows)."""
    fallbacks: tuple[str, ...] = ()
    """The methods after ``method`` (of those asked about, in order) that CAA
    allows every one of ``names`` to use: what an order may fall back to when the
    CA offers no ``method`` challenge. Boulder judges CAA for the method that
    validates (va/caa.go checkCAA with the authorization's challenge type)."""


async def allowed_issuers(
    hostname: str,
    issuers: Sequence[tuple[str, CaaIssuer]],
    lookup: CaaLookup,
    methods: Sequence[str] = (VALIDATION_METHOD,),
) -> IssuersAllowed:
    """The names of the ``issuers`` (name, CA) that CAA lets issue for ``hostname``,
    in the order given, and the reason for the first; one CAA set decides for all.

    Raises ``DnsCheckError(DNS_CAA)`` when CAA allows none of them, naming the
    issuer domains it would have to allow, and ``DnsCheckError(ACME_TEMPORARY)``
    when a lookup fails. ``methods``: the validation methods ready, in order of
    preference: the first that CAA allows some issuer to use decides
    (``IssuersAllowed.method``). A wildcard (``*.``) is judged on its base name with
    ``issuewild``.
    """
    wildcard = hostname.startswith("*.")
    base = hostname[2:] if wildcard else hostname
    expected = ", ".join(_unique(d for _, issuer in issuers for d in issuer.domains))
    try:
        found = await find_caa_set(base, lookup)
    except DnsCheckError as err:
        err.expected = expected
        raise
    verdicts: list[tuple[str, CaaVerdict]] = []
    for method in methods:
        verdicts = [
            (name, caa_allows(found, issuer, wildcard=wildcard, method=method))
            for name, issuer in issuers
        ]
        allowed = [name for name, verdict in verdicts if verdict.allowed]
        if allowed:
            first = next(verdict for name, verdict in verdicts if name == allowed[0])
            later = methods[list(methods).index(method) + 1 :]
            by_name = dict(issuers)
            fallbacks = tuple(
                m
                for m in later
                if all(caa_allows(found, by_name[n], wildcard=wildcard, method=m).allowed for n in allowed)
            )
            return IssuersAllowed(allowed, first.reason, caa_reading(found), method, fallbacks)
    verdicts = [
        (name, caa_allows(found, issuer, wildcard=wildcard, method=methods[0]))
        for name, issuer in issuers
    ]
    assert found is not None  # no set at all permits every CA
    reason = verdicts[0][1].reason
    if len(issuers) > 1:
        reason += f"; none of our CAs is allowed: CAA would have to allow one of {expected}"
    raise DnsCheckError(
        ErrorCode.DNS_CAA,
        reason,
        found=[r.to_text() for r in found.records],
        expected=expected,
    )
