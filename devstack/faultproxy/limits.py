"""Let's Encrypt's rate limits as Boulder applies them, for the fault proxy: its GCRA
buckets, when tokens are spent, the exemptions, and its refusal's exact text and
headers (the package's docstring)."""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import math
import random
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cryptography import x509

from certflow.hostnames import registered_domain

from devstack.faultproxy.faults import Endpoint, _RenewalInfo, _jws_payload, _new_order_identifiers, _normalize_host


# ------------------------------------------------------------------ rate limits
#
# Let's Encrypt's limits as Boulder applies them (letsencrypt/boulder at 2d00c8e2):
# the buckets are GCRA token buckets (ratelimits/gcra.go), one token coming back
# every period / capacity; new-order checks them all in one batch
# (wfe2/wfe.go checkNewOrderLimits → ratelimits/transaction.go
# NewOrderLimitTransactions) and spends only NewOrdersPerAccount there (refunded
# when the order is not created); the certificate limits are checked there and
# spent at issuance (ra/ra.go countCertificateIssued), failed authorizations when
# a validation fails (ra/ra.go countFailedValidations).

RATE_LIMITS_DOCS = "https://letsencrypt.org/docs/rate-limits/"
RATE_LIMITS_HELP_LINK = '<https://letsencrypt.org/docs/rate-limits>;rel="help"'
"""Boulder's ``Link`` on a rate-limit answer (wfe2/wfe.go sendError: ``link(
"https://letsencrypt.org/docs/rate-limits", "help")``, no trailing slash)."""
RATE_LIMITED = "urn:ietf:params:acme:error:rateLimited"
MALFORMED = "urn:ietf:params:acme:error:malformed"

NEW_ORDERS_PER_ACCOUNT = "NewOrdersPerAccount"
CERTIFICATES_PER_DOMAIN = "CertificatesPerDomain"
CERTIFICATES_PER_FQDN_SET = "CertificatesPerFQDNSet"
FAILED_AUTHORIZATIONS = "FailedAuthorizationsPerDomainPerAccount"

_ANCHORS = {
    NEW_ORDERS_PER_ACCOUNT: "new-orders-per-account",
    CERTIFICATES_PER_DOMAIN: "new-certificates-per-registered-domain",
    CERTIFICATES_PER_FQDN_SET: "new-certificates-per-exact-set-of-identifiers",
    FAILED_AUTHORIZATIONS: "authorization-failures-per-identifier-per-account",
}

_EPSILON = 1e-9


class OrderKind(StrEnum):
    """How the emulator counted a new order (Boulder's exemptions, wfe2/wfe.go NewOrder)."""

    NEW = "new"
    """Every limit applies."""
    RENEWAL = "renewal"
    """Same identifier set as a certificate already issued: exempt from
    NewOrdersPerAccount and CertificatesPerDomain."""
    ARI_RENEWAL = "ari_renewal"
    """``replaces`` names a certificate the proxy saw issued, inside the ARI window
    the proxy serves: exempt from every limit."""


class SpendAt(StrEnum):
    """When the certificate limits (per registered domain, per identifier set) are spent."""

    ISSUANCE = "issuance"
    """As Boulder: checked at new-order, spent when the certificate is issued. Orders
    placed before earlier ones are issued all pass the check (as at Let's Encrypt)."""
    ORDER = "order"
    """Spent when Pebble created the order (201), refunded when it did not: a CA
    without that race, so a burst of orders finds the bucket exactly."""


@dataclass(frozen=True)
class Bucket:
    """One limit: ``capacity`` tokens per ``period`` seconds (Boulder's burst = count),
    one coming back every ``period / capacity`` seconds (GCRA); time scaled, so a
    Let's Encrypt week can be ``period=20.0``."""

    capacity: int
    period: float

    def __post_init__(self) -> None:
        if self.capacity < 1 or not self.period > 0:
            raise ValueError(f"a Bucket needs capacity >= 1 and period > 0, not {self!r}")

    @property
    def emission(self) -> float:
        """Seconds for one token to come back."""
        return self.period / self.capacity


@dataclass(frozen=True)
class LimitsConfig:
    """Which of Let's Encrypt's limits the proxy enforces (None: that limit is off)."""

    new_orders: Bucket | None = None
    """NewOrdersPerAccount, per account (JWS ``kid``)."""
    per_domain: Bucket | None = None
    """CertificatesPerDomain, per registered domain (public suffix + 1 label)."""
    per_identifier_set: Bucket | None = None
    """CertificatesPerFQDNSet, per exact set of identifiers."""
    failed_authorizations: Bucket | None = None
    """FailedAuthorizationsPerDomainPerAccount, per identifier per account."""
    certificates_spent_at: SpendAt = SpendAt.ISSUANCE
    jitter: float = 0.03
    """Retry-After is the wait for a token plus up to this fraction (Boulder: 3 %)."""
    clock: Callable[[], float] = time.monotonic
    """The buckets' clock (seconds); tests may pass a fake one."""

    def bucket(self, limit: str) -> Bucket | None:
        return {
            NEW_ORDERS_PER_ACCOUNT: self.new_orders,
            CERTIFICATES_PER_DOMAIN: self.per_domain,
            CERTIFICATES_PER_FQDN_SET: self.per_identifier_set,
            FAILED_AUTHORIZATIONS: self.failed_authorizations,
        }[limit]


@dataclass(frozen=True)
class LimitCheck:
    """One bucket consulted for a new order."""

    limit: str
    """Boulder's name (``NewOrdersPerAccount``, ``CertificatesPerDomain``, ...)."""
    key: str
    """The account URL, the registered domain, the comma-joined sorted identifier
    set, or ``<account URL>:<identifier>`` (Boulder's ``regId:identValue``)."""
    allowed: bool
    remaining: int
    """Whole tokens left (after this order, when allowed)."""
    retry_in: float
    """Seconds until the bucket has a token (0 when allowed)."""


@dataclass(frozen=True)
class LimitDecision:
    """The emulator's verdict on one new-order request."""

    at: float
    """``time.time()`` when decided (before forwarding, or answering 429)."""
    account: str
    identifiers: frozenset[str]
    kind: OrderKind
    replaces: str | None
    allowed: bool
    """Forwarded to Pebble (True) or answered 429 by the proxy (False)."""
    checks: tuple[LimitCheck, ...]
    limit: str | None = None
    """The refusing limit (the strictest denied bucket)."""
    key: str | None = None
    retry_after: int | None = None
    """The ``Retry-After`` sent (seconds)."""
    detail: str | None = None

    @property
    def ends(self) -> float | None:
        """``at + retry_after`` for a refusal: when the client may come back."""
        return None if self.retry_after is None else self.at + self.retry_after


@dataclass(frozen=True)
class LimitSpend:
    """A token taken from (or, ``cause="refund"``, given back to) a bucket."""

    at: float
    limit: str
    key: str
    cause: str
    """``new-order``, ``issuance``, ``failed-authorization`` or ``refund``."""


def ari_cert_id(certificate: x509.Certificate) -> str:
    """RFC 9773 §4.1 certID: base64url(AKI keyIdentifier) "." base64url(serial DER content)."""
    aki = certificate.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    if aki.key_identifier is None:
        raise ValueError("the certificate's AKI has no keyIdentifier")
    serial = certificate.serial_number
    der = serial.to_bytes(serial.bit_length() // 8 + 1, "big", signed=False)
    return f"{_b64url(aki.key_identifier)}.{_b64url(der)}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String`` prints it (``168h0m0s``, ``20s``,
    ``1m30s``, ``1.5s``, ``500ms``), as Boulder's details show periods."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-" if ns < 0 else ""), abs(ns)

    def decimal(value: int, unit: int) -> str:
        whole, frac = divmod(value, unit)
        digits = str(frac).rjust(len(str(unit)) - 1, "0").rstrip("0")
        return f"{whole}.{digits}" if digits else str(whole)

    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{decimal(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{decimal(ns, 1_000_000)}ms"
    total_s, frac_ns = divmod(ns, 1_000_000_000)
    minutes, secs = divmod(total_s, 60)
    hours, minutes = divmod(minutes, 60)
    sec = decimal(secs * 1_000_000_000 + frac_ns, 1_000_000_000)
    if hours:
        return f"{sign}{hours}h{minutes}m{sec}s"
    if minutes:
        return f"{sign}{minutes}m{sec}s"
    return f"{sign}{sec}s"


def _boulder_detail(limit: str, bucket: Bucket, key: str, retry_at: float) -> str:
    """Boulder's detail for a denied limit (ratelimits/limiter.go Decision.Result, with
    errors/errors.go's ``: see <page>#<anchor>``)."""
    stamp = datetime.datetime.fromtimestamp(retry_at, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    period = go_duration(bucket.period)
    n = bucket.capacity
    if limit == NEW_ORDERS_PER_ACCOUNT:
        text = f"too many new orders ({n}) from this account in the last {period}"
    elif limit == CERTIFICATES_PER_DOMAIN:
        text = f"too many certificates ({n}) already issued for {json.dumps(key)} in the last {period}"
    elif limit == CERTIFICATES_PER_FQDN_SET:
        text = (
            f"too many certificates ({n}) already issued for this exact set of identifiers"
            f" in the last {period}"
        )
    else:
        ident = key.rpartition(":")[2]
        text = f"too many failed authorizations ({n}) for {json.dumps(ident)} in the last {period}"
    return f"{text}, retry after {stamp}: see {RATE_LIMITS_DOCS}#{_ANCHORS[limit]}"


@dataclass
class _Verdict:
    decision: LimitDecision
    spent: list[tuple[str, str]]
    """Buckets spent at the decision, refunded when Pebble does not create the order."""


def _jws_protected(body: bytes | None) -> dict[str, Any]:
    if not body:
        return {}
    try:
        encoded = json.loads(body)["protected"]
        header = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (ValueError, KeyError, TypeError, binascii.Error):
        return {}
    return header if isinstance(header, dict) else {}


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _url_path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


def _link_up(headers: list[tuple[str, str]]) -> str | None:
    for name, value in headers:
        if name.lower() != "link":
            continue
        for part in value.split(","):
            if 'rel="up"' in part.replace(" ", "") and "<" in part and ">" in part:
                return part[part.index("<") + 1 : part.index(">")]
    return None


class _Limits:
    """The emulator's buckets and what the proxy saw issued; guarded by _State.lock."""

    def __init__(self) -> None:
        self.config: LimitsConfig | None = None
        self.tats: dict[tuple[str, str], float] = {}
        self.decisions: list[LimitDecision] = []
        self.spends: list[LimitSpend] = []
        # What the CA issued, as seen through the proxy (kept across emulate_limits).
        self.issued_sets: set[frozenset[str]] = set()
        self.issued_paths: set[str] = set()
        self.cert_ids: dict[str, frozenset[str]] = {}
        self.authz_identifiers: dict[str, str] = {}
        self.failed_authz: set[str] = set()

    def reset(self, config: LimitsConfig | None) -> None:
        self.config = config
        self.tats.clear()
        self.decisions.clear()
        self.spends.clear()

    # ------------------------------------------------------------- GCRA

    def _check(self, limit: str, bucket: Bucket, key: str, now: float) -> LimitCheck:
        """ratelimits/gcra.go maybeSpend, without storing anything."""
        tat = max(now, self.tats.get((limit, key), now))
        new_tat = tat + bucket.emission
        difference = now - (new_tat - bucket.period)
        if difference < -_EPSILON:
            remaining = int((now - (tat - bucket.period)) // bucket.emission + _EPSILON)
            return LimitCheck(limit, key, False, max(remaining, 0), -difference)
        remaining = int(max(difference, 0.0) // bucket.emission + _EPSILON)
        return LimitCheck(limit, key, True, remaining, 0.0)

    def _spend(self, limit: str, key: str, now: float, at: float, cause: str) -> bool:
        """Take a token when there is one (Boulder's spend-only transactions are best
        effort: an empty bucket stays as it is)."""
        assert self.config is not None
        bucket = self.config.bucket(limit)
        if bucket is None or not self._check(limit, bucket, key, now).allowed:
            return False
        self.tats[(limit, key)] = max(now, self.tats.get((limit, key), now)) + bucket.emission
        self.spends.append(LimitSpend(at, limit, key, cause))
        return True

    def _refund(self, limit: str, key: str, now: float, at: float) -> None:
        assert self.config is not None
        bucket = self.config.bucket(limit)
        tat = self.tats.get((limit, key))
        if bucket is None or tat is None or tat <= now:
            return
        self.tats[(limit, key)] = max(tat - bucket.emission, now)
        self.spends.append(LimitSpend(at, limit, key, "refund"))

    def remaining(self, limit: str, key: str) -> int | None:
        if self.config is None or (bucket := self.config.bucket(limit)) is None:
            return None
        now = self.config.clock()
        tat = max(now, self.tats.get((limit, key), now))
        return int(max(0.0, now - (tat - bucket.period)) // bucket.emission + _EPSILON)

    # -------------------------------------------------------- new-order

    def _certificate_spends(self, identifiers: frozenset[str], renewal: bool) -> list[tuple[str, str]]:
        """ra/ra.go countCertificateIssued: per registered domain (not for a renewal)
        and per identifier set."""
        spends: list[tuple[str, str]] = []
        if not renewal:
            domains = sorted({registered_domain(i) for i in identifiers})
            spends += [(CERTIFICATES_PER_DOMAIN, d) for d in domains]
        spends.append((CERTIFICATES_PER_FQDN_SET, ",".join(sorted(identifiers))))
        return spends

    def decide(
        self, body: bytes | None, renewal_info: _RenewalInfo | None
    ) -> _Verdict | None:
        """Boulder's new-order checks; None when the emulator is off or the request is
        no new-order it can read (Pebble answers that one)."""
        config = self.config
        if config is None:
            return None
        payload_raw = _jws_payload(body)
        try:
            payload = json.loads(payload_raw) if payload_raw else None
        except ValueError:
            payload = None
        identifiers = frozenset(_new_order_identifiers(body))
        account = str(_jws_protected(body).get("kid") or "")
        if not isinstance(payload, dict) or not identifiers:
            return None
        replaces = payload.get("replaces")
        replaces = str(replaces) if replaces else None
        now, at = config.clock(), time.time()

        in_window = renewal_info is not None and (
            renewal_info.start.timestamp() <= at < renewal_info.end.timestamp()
        )
        if replaces is not None and replaces in self.cert_ids and in_window:
            kind = OrderKind.ARI_RENEWAL
        elif identifiers in self.issued_sets:
            kind = OrderKind.RENEWAL
        else:
            kind = OrderKind.NEW

        wanted: list[tuple[str, str]] = []
        if kind is not OrderKind.ARI_RENEWAL:
            if kind is OrderKind.NEW:
                wanted.append((NEW_ORDERS_PER_ACCOUNT, account))
            wanted += [(FAILED_AUTHORIZATIONS, f"{account}:{i}") for i in sorted(identifiers)]
            if kind is OrderKind.NEW:
                wanted += [
                    (CERTIFICATES_PER_DOMAIN, d)
                    for d in sorted({registered_domain(i) for i in identifiers})
                ]
            wanted.append((CERTIFICATES_PER_FQDN_SET, ",".join(sorted(identifiers))))
        checks = tuple(
            self._check(limit, bucket, key, now)
            for limit, key in wanted
            if (bucket := config.bucket(limit)) is not None
        )
        denied = [c for c in checks if not c.allowed]
        if denied:
            # limiter.go stricter(): the longest wait, then the fewest remaining.
            worst = max(denied, key=lambda c: (c.retry_in, -c.remaining))
            bucket = config.bucket(worst.limit)
            assert bucket is not None
            wait = worst.retry_in * (1.0 + config.jitter * random.random())
            retry_after = max(1, math.ceil(wait - _EPSILON))
            decision = LimitDecision(
                at=at,
                account=account,
                identifiers=identifiers,
                kind=kind,
                replaces=replaces,
                allowed=False,
                checks=checks,
                limit=worst.limit,
                key=worst.key,
                retry_after=retry_after,
                detail=_boulder_detail(worst.limit, bucket, worst.key, at + wait),
            )
            self.decisions.append(decision)
            return _Verdict(decision, [])

        spent: list[tuple[str, str]] = []
        if kind is OrderKind.NEW and self._spend(NEW_ORDERS_PER_ACCOUNT, account, now, at, "new-order"):
            spent.append((NEW_ORDERS_PER_ACCOUNT, account))
        if config.certificates_spent_at is SpendAt.ORDER:
            for limit, key in self._certificate_spends(identifiers, kind is not OrderKind.NEW):
                if self._spend(limit, key, now, at, "new-order"):
                    spent.append((limit, key))
        decision = LimitDecision(
            at=at,
            account=account,
            identifiers=identifiers,
            kind=kind,
            replaces=replaces,
            allowed=True,
            checks=checks,
        )
        self.decisions.append(decision)
        return _Verdict(decision, spent)

    def settle(self, verdict: _Verdict, created: bool) -> None:
        """wfe2/wfe.go NewOrder: the limits spent for an order Pebble did not create
        are refunded."""
        if created or self.config is None:
            return
        now, at = self.config.clock(), time.time()
        for limit, key in verdict.spent:
            self._refund(limit, key, now, at)

    # ----------------------------------------------------- what the CA did

    def observe(
        self,
        endpoint: Endpoint,
        request_body: bytes | None,
        path: str,
        status: int,
        headers: list[tuple[str, str]],
        data: bytes,
    ) -> None:
        """Learn issuances and failed validations from Pebble's answers."""
        if status not in (200, 201):
            return
        account = str(_jws_protected(request_body).get("kid") or "")
        if endpoint is Endpoint.NEW_ORDER and status == 201:
            order = _json_object(data)
            authzs = [str(a) for a in order.get("authorizations") or []]
            asked = [
                _normalize_host(str(i.get("value")))
                for i in order.get("identifiers") or []
                if isinstance(i, dict)
            ]
            if len(authzs) == 1 and len(asked) == 1:
                self.authz_identifiers.setdefault(_url_path(authzs[0]), asked[0])
        elif endpoint in (Endpoint.ORDER, Endpoint.FINALIZE):
            order = _json_object(data)
            idents = frozenset(
                _normalize_host(str(i.get("value")))
                for i in order.get("identifiers") or []
                if isinstance(i, dict) and "value" in i
            )
            if order.get("status") == "valid" and order.get("certificate") and idents:
                self._issued(_url_path(str(order["certificate"])), idents)
            elif order.get("status") == "invalid":
                for authz in order.get("authorizations") or []:
                    self._failed(_url_path(str(authz)), account)
        elif endpoint is Endpoint.AUTHZ:
            authz = _json_object(data)
            identifier = authz.get("identifier")
            if isinstance(identifier, dict) and "value" in identifier:
                self.authz_identifiers[_url_path(path)] = _normalize_host(str(identifier["value"]))
            if authz.get("status") == "invalid":
                self._failed(_url_path(path), account)
        elif endpoint is Endpoint.CHALLENGE:
            if _json_object(data).get("status") == "invalid":
                up = _link_up(headers)
                if up is not None:
                    self._failed(_url_path(up), account)
        elif endpoint is Endpoint.CERT and status == 200:
            try:
                leaf = x509.load_pem_x509_certificate(data)
                names = leaf.extensions.get_extension_for_class(
                    x509.SubjectAlternativeName
                ).value.get_values_for_type(x509.DNSName)
                cert_id = ari_cert_id(leaf)
            except (ValueError, x509.ExtensionNotFound):
                return
            named = frozenset(_normalize_host(n) for n in names)
            self.cert_ids[cert_id] = named
            self._issued(_url_path(path), named)

    def _issued(self, cert_path: str, identifiers: frozenset[str]) -> None:
        if cert_path in self.issued_paths:
            return
        self.issued_paths.add(cert_path)
        renewal = identifiers in self.issued_sets
        self.issued_sets.add(identifiers)
        config = self.config
        if config is None or config.certificates_spent_at is not SpendAt.ISSUANCE:
            return
        now, at = config.clock(), time.time()
        for limit, key in self._certificate_spends(identifiers, renewal):
            self._spend(limit, key, now, at, "issuance")

    def _failed(self, authz_path: str, account: str) -> None:
        identifier = self.authz_identifiers.get(authz_path)
        if identifier is None or authz_path in self.failed_authz:
            return
        self.failed_authz.add(authz_path)
        config = self.config
        if config is None:
            return
        self._spend(
            FAILED_AUTHORIZATIONS,
            f"{account}:{identifier}",
            config.clock(),
            time.time(),
            "failed-authorization",
        )


class _ValidationFailures:
    """Validations the proxy makes fail as Boulder's VA would report them: after the
    accept of a listed hostname's challenge, its authorization, challenge and order
    read ``invalid``, the challenge carrying the problem.

    That accept never reaches Pebble (:meth:`held_accept` answers it), so Pebble
    never validates the authorization behind the proxy's back: a valid one there
    could come back in a later order (Pebble reuses valid authorizations, even at
    ``PEBBLE_AUTHZREUSE=0`` one time in a hundred), where Boulder never reuses an
    invalid one."""

    def __init__(self) -> None:
        # hostname → (problem document, seconds the validation takes)
        self.problems: dict[str, tuple[dict[str, Any], float]] = {}
        self._authz_of: dict[str, tuple[str, str]] = {}  # challenge path → (authz path, hostname)
        self._failed: dict[str, tuple[dict[str, Any], float]] = {}  # authz path → (problem, when)
        self._challenges: dict[str, dict[str, Any]] = {}  # challenge path → as Pebble showed it

    def _verdict(self, authz_path: str) -> dict[str, Any] | None:
        """The failed validation's problem once it is over; None while it runs (the
        CA shows the challenge pending meanwhile, as Boulder does)."""
        problem, when = self._failed[authz_path]
        return problem if time.monotonic() >= when else None

    def held_accept(
        self, endpoint: Endpoint, method: str, path: str, body: bytes | None
    ) -> tuple[int, dict[str, Any], str] | None:
        """The answer (status, JSON document, the authorization's URL) to an accept
        kept from Pebble: one that starts a failing validation, or any later accept
        of a challenge whose validation fails. While it runs the challenge reads
        ``pending``; once over, a new accept gets Boulder's answer for an
        authorization no longer pending (ra.go PerformValidation). None: forward."""
        if endpoint is not Endpoint.CHALLENGE or method != "POST" or _jws_payload(body) != b"{}":
            return None
        request_path = urllib.parse.urlsplit(path).path
        found = self._authz_of.get(request_path)
        challenge = self._challenges.get(request_path)
        if found is None or challenge is None:
            return None
        authz_path, hostname = found
        authz_url = urllib.parse.urlsplit(str(challenge.get("url", "")))._replace(path=authz_path).geturl()
        if authz_path in self._failed:
            over = self._verdict(authz_path) is not None
        elif hostname in self.problems:
            problem, takes = self.problems[hostname]
            self._failed[authz_path] = (problem, time.monotonic() + takes)
            over = False  # the validation starts: the CA answers before it ends
        else:
            return None
        if over:
            detail = "Unable to update challenge :: authorization must be pending"
            return 400, {"type": MALFORMED, "detail": detail, "status": 400}, authz_url
        shown = dict(challenge, status="pending")
        shown.pop("validated", None)
        return 200, shown, authz_url

    def rewrite(self, endpoint: Endpoint, path: str, data: bytes) -> bytes:
        """Pebble's answer as the failed validations show it."""
        if not self.problems and not self._failed:
            return data
        try:
            document = json.loads(data) if data else None
        except ValueError:
            return data
        if not isinstance(document, dict):
            return data
        request_path = urllib.parse.urlsplit(path).path
        if endpoint is Endpoint.AUTHZ:
            hostname = str((document.get("identifier") or {}).get("value", "")).lower()
            if hostname in self.problems:
                for challenge in document.get("challenges") or []:
                    url_path = urllib.parse.urlsplit(str(challenge.get("url", ""))).path
                    self._authz_of[url_path] = (request_path, hostname)
                    self._challenges[url_path] = dict(challenge)
            if request_path not in self._failed:
                return data
            problem = self._verdict(request_path)
            document["status"] = "pending" if problem is None else "invalid"
            for challenge in document.get("challenges") or []:
                if challenge.get("type") != "http-01":
                    continue
                if problem is None:
                    challenge["status"] = "pending"
                    challenge.pop("validated", None)
                else:
                    challenge.update(status="invalid", error=problem)
        elif endpoint is Endpoint.CHALLENGE:
            found = self._authz_of.get(request_path)
            if found is None:
                return data
            authz_path, _ = found
            if authz_path not in self._failed:
                return data
            verdict = self._verdict(authz_path)
            if verdict is None:
                document["status"] = "pending"
                document.pop("validated", None)
            else:
                document.update(status="invalid", error=verdict)
        elif endpoint is Endpoint.ORDER:
            authz_paths = {
                urllib.parse.urlsplit(str(u)).path for u in document.get("authorizations") or []
            }
            failed = authz_paths & set(self._failed)
            if not failed:
                return data
            over = any(self._verdict(path) is not None for path in failed)
            document["status"] = "invalid" if over else "pending"
        else:
            return data
        return json.dumps(document).encode()
