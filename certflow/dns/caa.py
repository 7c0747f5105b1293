"""CAA as Let's Encrypt's Boulder reads it (``va/caa.go``).

The relevant RRset of a name is the CAA records in the answer to a CAA query for
it, the resolver following CNAMEs (RFC 8659 §3), for the hostname and then each
of *its* parents up to the TLD; the first non-empty set decides. The walk
(:func:`find_caa_set`) is separate from the decision (:func:`caa_allows`), so one
walk can be judged for several CAs. Issuer domains compare exactly, as Boulder
compares them; RFC 8657 ``accounturi`` and ``validationmethods`` apply.

The decisions are pure functions over plain data or over an injected lookup, so
they are unit-testable without DNS. Failures are
:class:`~certflow.errors.DnsCheckError` with code ``DNS_CAA`` or, for a failed
lookup, ``ACME_TEMPORARY`` (SPEC §4).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import dns.message
import dns.rdatatype
import dns.rdtypes.ANY.CAA

from certflow.dns.lookup import CnameAnswer, DnsLookupError, canonical as _canonical, cname_answers, rrsets, unique as _unique
from certflow.errors import DnsCheckError, ErrorCode

VALIDATION_METHOD = "http-01"
"""The ACME challenge certflow validates with (RFC 8657 ``validationmethods``)."""
# Property tags the CA understands. Anything else is "unknown", and an unknown
# tag marked critical forbids issuance (RFC 8659 §4.1). This is Boulder's list
# (``filterCAA``): RFC 8659's three plus issuemail (RFC 9495) and issuevmc
# (BIMI). contactemail/contactphone (CA/B Forum BR) are *not* on it, so a
# critical one makes Let's Encrypt refuse, and it makes us refuse too.
_KNOWN_CAA_TAGS = frozenset({"issue", "issuewild", "iodef", "issuemail", "issuevmc"})

# RFC 8659 §4.2 issue-value grammar pieces.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_ISSUER_DOMAIN_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
# Parameter tags as Boulder's parseCAARecord accepts them: ASCII letters and
# digits only (no hyphens, although RFC 8659's grammar allows inner ones).
_PARAM_TAG_RE = re.compile(r"[A-Za-z0-9]*")
_PARAM_VALUE_RE = re.compile(r"[\x21-\x3a\x3c-\x7e]*")
# RFC 8657 §4: validationmethods = [*(label ",") label], label = 1*(ALPHA / DIGIT / "-").
_METHOD_RE = re.compile(r"[A-Za-z0-9-]+")
_WSP = " \t"

_PREVIEW_CHARS = 60
_PARAM_PREVIEW_CHARS = 100
_ARROW = " → "



@dataclass(frozen=True)
class CaaRecord:
    """One CAA resource record's data (RFC 8659 §4.1)."""

    flags: int
    tag: str
    value: str

    @property
    def critical(self) -> bool:
        """The Issuer Critical flag: bit 128, or bit 1 as many tools write it (as Boulder)."""
        return bool(self.flags & (128 | 1))

    def to_text(self) -> str:
        """Zone-file presentation, e.g. ``0 issue "letsencrypt.org"``."""
        return f'{self.flags} {self.tag} "{_escape_character_string(self.value)}"'


@dataclass(frozen=True)
class CaaAnswer:
    """A CAA record as returned by a lookup, with the name that owns it."""

    owner: str
    record: CaaRecord


@dataclass(frozen=True)
class CaaAnswerSet:
    """The answer section of a CAA query: the CNAME chain the resolver followed
    (owner → target …) and the CAA records (normally owned by the chain's last
    name). Both may be empty (NXDOMAIN, NODATA, or NODATA at the alias target)."""

    cnames: Sequence[CnameAnswer] = ()
    caa: Sequence[CaaAnswer] = ()


@dataclass(frozen=True)
class CaaSet:
    """The relevant CAA RRset that decides for ``hostname`` (RFC 8659 §3).

    ``name`` is the name whose CAA query returned it (the hostname or one of its
    parents); ``chain`` is ``name`` followed by each CNAME target up to the
    name owning ``records`` (just ``(name,)`` without an alias).
    """

    hostname: str
    name: str
    chain: tuple[str, ...]
    records: tuple[CaaRecord, ...]

    @property
    def owner(self) -> str:
        """Where the records were found: the end of the alias chain."""
        return self.chain[-1]

    @property
    def location(self) -> str:
        """``CAA at <owner>``, with ``(via a → b)`` when reached through an alias."""
        where = f"CAA at {self.owner}"
        if len(self.chain) > 1:
            where += f" (via {_ARROW.join(self.chain)})"
        return where


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
            if not _ISSUER_DOMAIN_RE.fullmatch(domain):
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


CaaLookup = Callable[[str], Awaitable[CaaAnswerSet]]
"""Returns the CNAME and CAA records in the answer to a CAA query for a name."""



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


def _escape_character_string(value: str) -> str:
    out = []
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable() and char.isascii():
            out.append(char)
        else:
            out.extend(f"\\{byte:03d}" for byte in char.encode("utf-8", "surrogatepass"))
    return "".join(out)



@dataclass(frozen=True)
class IssueValue:
    """A parsed ``issue``/``issuewild`` value: issuer-domain as written (``""``
    for ``";"``) and its parameters in order, tags as written."""

    issuer: str
    params: tuple[tuple[str, str], ...]


def parse_issue_value(value: str) -> IssueValue | None:
    """Parse an ``issue``/``issuewild`` value (RFC 8659 §4.2), ``None`` if malformed.

    Mirrors Boulder's ``parseCAARecord``: split on ``;``, whitespace (space,
    tab) trimmed; one empty parameter after the domain is allowed
    (``letsencrypt.org;``), any other parameter must be ``tag=value`` with an
    alphanumeric tag and a value of printable ASCII without ``;``. A malformed
    parameter makes the whole value malformed (it authorizes nothing). Unlike
    Boulder, the issuer-domain is checked against the RFC 8659 grammar too,
    which changes no verdict (a malformed domain never equals the CA's), only
    the message.
    """
    issuer, *params = value.split(";")
    issuer = issuer.strip(_WSP)
    if issuer and not _ISSUER_DOMAIN_RE.fullmatch(issuer):
        return None
    if len(params) == 1 and not params[0].strip(_WSP):
        params = []
    parsed: list[tuple[str, str]] = []
    for param in params:
        tag, equals, param_value = param.partition("=")
        tag, param_value = tag.strip(_WSP), param_value.strip(_WSP)
        if (
            not equals
            or not _PARAM_TAG_RE.fullmatch(tag)
            or not _PARAM_VALUE_RE.fullmatch(param_value)
        ):
            return None
        parsed.append((tag, param_value))
    # Kept as written: Boulder compares issuer domains byte for byte
    # (va/caa.go caaDomainMatches: caaDomain == issuerDomain).
    return IssueValue(issuer, tuple(parsed))


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
    if uri != issuer.account_uri:  # exact string comparison, as Boulder
        return f"only for account {_short(uri)} (ours is {_short(issuer.account_uri)})"
    return None


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
        shown = _escape_character_string(empty[0])
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


def caa_lookup_names(hostname: str) -> list[str]:
    """The names whose CAA RRsets are consulted: the name, then each parent up to the TLD."""
    labels = _canonical(hostname).split(".")
    return [".".join(labels[i:]) for i in range(len(labels)) if labels[i]]


def _relevant_set(hostname: str, name: str, answer: CaaAnswerSet) -> CaaSet | None:
    """The CAA RRset of ``name`` in one answer, its CNAME chain followed; ``None`` if empty.

    The chain starts at ``name`` and follows the answer's CNAME records (the
    first one per owner; a loop ends it). CAA records owned by a name off the
    chain are ignored; the set is owned by the last name of the chain that owns
    any (in valid DNS only the end of the chain can own CAA records).
    """
    targets: dict[str, str] = {}
    for cname in answer.cnames:
        targets.setdefault(_canonical(cname.owner), _canonical(cname.target))
    chain = [name]
    while (target := targets.get(chain[-1])) is not None and target not in chain:
        chain.append(target)
    owned: dict[str, list[CaaRecord]] = {}
    for caa in answer.caa:
        owner = _canonical(caa.owner)
        if owner in chain:
            owned.setdefault(owner, []).append(caa.record)
    if not owned:
        return None
    end = max(chain.index(owner) for owner in owned)
    records = [r for owner in chain[: end + 1] for r in owned.get(owner, [])]
    return CaaSet(hostname, name, tuple(chain[: end + 1]), tuple(records))


async def find_caa_set(hostname: str, lookup: CaaLookup) -> CaaSet | None:
    """The relevant CAA RRset for ``hostname`` (RFC 8659 §3, as Boulder reads it).

    Asks ``lookup`` for the hostname, then each of the hostname's own parents
    up to the TLD (never the root, never the alias target's parents); the first
    name whose answer holds CAA records on its CNAME chain decides. An answer
    with only the chain (NODATA at the target) is an empty set: the climb goes
    on. ``None`` when no name has any.

    Raises ``DnsCheckError(ACME_TEMPORARY)`` when a lookup fails (SERVFAIL,
    timeout): a failed lookup could hide a denying set, but it is no denial.
    Its ``expected`` is empty (no CA is judged here; :func:`check_caa` fills it).
    """
    host = _canonical(hostname)
    for name in caa_lookup_names(host):
        try:
            answer = await lookup(name)
        except DnsLookupError as exc:
            applies = "" if name == host else f" (applies to {host})"
            raise DnsCheckError(
                ErrorCode.ACME_TEMPORARY,
                f"CAA lookup for {name} failed: {exc.reason}{applies}",
                found=[],
            ) from exc
        found = _relevant_set(host, name, answer)
        if found is not None:
            return found
    return None


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


def caa_reading(found: CaaSet | None) -> str:
    """The deciding CAA set as we read it, in one line that changes when the answer
    does (records sorted: the order a resolver lists them in means nothing)."""
    if found is None:
        return "no CAA records up to the TLD"
    return f"{found.location}: " + "; ".join(sorted(r.to_text() for r in found.records))


@dataclass(frozen=True)
class IssuersAllowed:
    """What one CAA walk allows: issuer names in order, the reason for the first,
    and the deciding set as read (:func:`caa_reading`)."""

    names: list[str]
    reason: str
    reading: str
    method: str = VALIDATION_METHOD
    """The validation method CAA was judged for (the first one it allows)."""


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
            return IssuersAllowed(allowed, first.reason, caa_reading(found), method)
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



def parse_caa_response(response: dns.message.Message) -> CaaAnswerSet:
    """The CNAME and CAA records (class IN, any owner) in a CAA response's answer section.

    A resolver answering a CAA query for an alias puts the CNAME chain first,
    then the CAA RRset of its last name (none: NODATA at the target); a DNAME
    comes with the CNAME it synthesizes, which is what the chain follows.
    Which records count is :func:`find_caa_set`'s business.
    """
    answers: list[CaaAnswer] = []
    for rrset in rrsets(response, dns.rdatatype.CAA):
        owner = rrset.name.to_text(omit_final_dot=True)
        for rdata in rrset:
            if not isinstance(rdata, dns.rdtypes.ANY.CAA.CAA):
                continue
            record = CaaRecord(
                flags=rdata.flags,
                # Tags are ASCII by spec; values are arbitrary octets.
                # backslashreplace keeps odd bytes visible (and malformed).
                tag=rdata.tag.decode("ascii", "backslashreplace"),
                value=rdata.value.decode("utf-8", "backslashreplace"),
            )
            answers.append(CaaAnswer(owner, record))
    return CaaAnswerSet(cnames=cname_answers(response), caa=answers)


