"""A fault-injecting HTTPS reverse proxy in front of a real Pebble, for tests.

Real CAs do not answer 429/503/500 or drop connections on demand, so tests put
this proxy between the ACME client and Pebble and tell it, per ACME endpoint,
which faults to inject::

    proxy = start_fault_proxy(pebble, pebble_workdir)
    proxy.inject(Endpoint.NEW_ORDER, Fault.rate_limited("30"))   # next new-order only
    proxy.inject_always(Endpoint.NONCE, Fault.unavailable())       # until cleared
    ... client.directory_url = proxy.directory_url ...
    assert proxy.count(Endpoint.NEW_ORDER) == 2
    proxy.stop()

How it stays transparent: Pebble builds every URL it hands out (directory,
``Location``, ``Link``, order/authz/challenge/cert URLs) from the request's
``Host`` header and checks each JWS ``url`` against it. The proxy therefore
forwards the client's ``Host`` (``127.0.0.1:<proxy port>``) unchanged while
connecting to Pebble's real port, so nothing needs rewriting and a client that
starts at :attr:`FaultProxy.directory_url` stays on the proxy. It serves TLS
with Pebble's own leaf certificate (valid for 127.0.0.1), so ``pebble.ca_bundle``
trusts the proxy as well.

Injected faults are answered by the proxy without forwarding anything (a
faulted new-order creates nothing at the CA). Error responses to POSTs carry a
fresh ``Replay-Nonce`` fetched from Pebble, as RFC 8555 section 6.5 asks of a
real server. Everything runs in background threads of the calling process and
does not touch any event loop; :meth:`FaultProxy.stop` ends them all.

ACME Renewal Information (RFC 9773), opt in: Pebble does not advertise
``renewalInfo``, so the proxy can play that part of the CA::

    proxy.serve_renewal_info(window_start, window_end, retry_after="3600")
    proxy.inject(Endpoint.RENEWAL_INFO, Fault.unavailable(retry_after="1"))  # optional
    ... a client reading proxy.directory_url now finds "renewalInfo" ...
    assert proxy.renewal_info_requests() == [cert_id]

From then on the proxied directory carries ``"renewalInfo":
proxy.renewal_info_url`` and ``GET <renewal_info_url>/<certID>`` is answered by
the proxy itself with that window and ``Retry-After``. Faults injected for
:attr:`Endpoint.RENEWAL_INFO` come first, as for any endpoint. Without the
opt-in nothing changes: the directory is relayed as Pebble sent it.

Request hooks, opt in: a test that must act at an exact point of an exchange
(e.g. kill the client right after the CA created an order) registers a
callback per endpoint::

    def created(request: Forwarded) -> None:
        if request.status == 201: ...           # Pebble's answer, not yet relayed
    remove = proxy.on_forwarded(Endpoint.NEW_ORDER, created)
    ...
    remove()

:meth:`FaultProxy.before_forwarding` registers the same kind of callback to
run *before* a request reaches Pebble (e.g. change what Pebble's validation
will see the moment a challenge is accepted).

The callback runs in the proxy's handler thread after Pebble answered a
forwarded request and before that answer is relayed to the client, so a
callback that blocks holds the answer back (and one that kills the client
means the client never sees it). Injected faults and the proxy's own ARI
answers are not forwarded, so they do not call hooks. An exception in a
callback is logged and otherwise ignored. Without hooks nothing changes.

Let's Encrypt's rate limits, opt in: the proxy decides, before forwarding a
new-order, whether Boulder's buckets allow it, and answers a refusal itself::

    proxy.emulate_limits(LimitsConfig(per_domain=Bucket(5, period=20.0)))  # 5 per "week"
    proxy.emulate_limits(LimitsConfig(new_orders=Bucket(3, period=10.0)))  # the account alone
    ... [d for d in proxy.limit_decisions() if not d.allowed] ...
    proxy.emulate_limits(None)                                             # off again

The buckets are Boulder's (letsencrypt/boulder ``ratelimits``): GCRA token
buckets holding ``capacity`` tokens, one coming back every ``period /
capacity`` seconds (time scaled: a "week" can be seconds), keyed as Let's
Encrypt keys them: NewOrdersPerAccount per account (the JWS ``kid``),
CertificatesPerDomain per registered domain (public suffix + 1 label,
``certflow.hostnames.registered_domain``), CertificatesPerFQDNSet per exact
identifier set, FailedAuthorizationsPerDomainPerAccount per identifier per
account. A new-order is checked against all of them at once and refused by the
strictest (``wfe2/wfe.go`` checkNewOrderLimits): HTTP 429,
``application/problem+json`` ``{"type": "urn:ietf:params:acme:error:rateLimited",
"detail": <Boulder's text, ending ": see
https://letsencrypt.org/docs/rate-limits/#<anchor>">, "status": 429}``,
``Retry-After`` = seconds until that bucket has a token plus up to 3 % jitter,
rounded up (Boulder rounds to the nearest second), Boulder's ``Link:
<https://letsencrypt.org/docs/rate-limits>;rel="help"`` and a fresh
``Replay-Nonce``; nothing reaches Pebble. When tokens are spent follows Boulder:
NewOrdersPerAccount when the order is created (taken at the decision, refunded
unless Pebble answered 201); the certificate limits are only checked at
new-order and spent when the certificate is issued (``ra/ra.go``
countCertificateIssued; the proxy sees the order turn ``valid`` or the
certificate downloaded), so orders placed before earlier ones are issued all
pass, as at Let's Encrypt; ``LimitsConfig(certificates_spent_at=SpendAt.ORDER)``
spends them at the 201 instead, for tests that need a burst to find the bucket
exactly. Failed authorizations are spent when the proxy sees an authorization
(or its challenge, or its order) turn ``invalid``. Exemptions as Let's Encrypt
applies them: an order for an identifier set the proxy saw issued is a renewal,
exempt from NewOrdersPerAccount and CertificatesPerDomain (and at issuance it
spends no CertificatesPerDomain); an order whose ``replaces`` names a
certificate the proxy saw downloaded (RFC 9773 certID, :func:`ari_cert_id`)
while the proxy serves an ARI window containing now is exempt from all limits.
Every decision is kept (:meth:`FaultProxy.limit_decisions`,
:meth:`~FaultProxy.limit_spends`, :meth:`~FaultProxy.limit_counts`). Injected
faults come first; without the opt-in nothing changes.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import datetime
import http
import http.client
import json
import logging
import math
import random
import socket
import socketserver
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509

from devstack.servers import PebbleStack
from certflow.hostnames import registered_domain

__all__ = [
    "Bucket",
    "Endpoint",
    "Fault",
    "FaultProxy",
    "Forwarded",
    "LimitCheck",
    "LimitDecision",
    "LimitSpend",
    "LimitsConfig",
    "OrderKind",
    "SpendAt",
    "ari_cert_id",
    "classify_path",
    "go_duration",
    "start_fault_proxy",
]

logger = logging.getLogger(__name__)

_UPSTREAM_TIMEOUT_S = 30.0
_IDLE_TIMEOUT_S = 120.0  # a keep-alive client connection idle this long is closed
_HANDSHAKE_TIMEOUT_S = 10.0
_STOP_JOIN_S = 5.0


class Endpoint(StrEnum):
    """The ACME resource a request is for, told apart by Pebble's URL paths."""

    DIRECTORY = "directory"
    NONCE = "nonce"
    NEW_ACCOUNT = "new-account"
    NEW_ORDER = "new-order"
    ORDER = "order"
    AUTHZ = "authz"
    CHALLENGE = "challenge"
    FINALIZE = "finalize"
    CERT = "cert"
    RENEWAL_INFO = "renewal-info"
    """The proxy's own ARI resource (see :meth:`FaultProxy.serve_renewal_info`)."""
    OTHER = "other"


# Pebble's paths (checked against Pebble's directory and a full issuance).
# RENEWAL_INFO is the proxy's own path (Pebble has none under that name).
# Everything else (/my-account/, /rollover-account-key, /revoke-cert,
# /list-orderz/, ...) is OTHER.
_EXACT_PATHS = {
    "/dir": Endpoint.DIRECTORY,
    "/nonce-plz": Endpoint.NONCE,
    "/sign-me-up": Endpoint.NEW_ACCOUNT,
    "/order-plz": Endpoint.NEW_ORDER,
}
_PATH_PREFIXES = (
    ("/my-order/", Endpoint.ORDER),
    ("/authZ/", Endpoint.AUTHZ),
    ("/chalZ/", Endpoint.CHALLENGE),
    ("/finalize-order/", Endpoint.FINALIZE),
    ("/certZ/", Endpoint.CERT),
    ("/renewal-info/", Endpoint.RENEWAL_INFO),
)

RENEWAL_INFO_PATH = "/renewal-info"


def classify_path(path: str) -> Endpoint:
    """Map a request target (path, optionally with a query) to its :class:`Endpoint`."""
    path = urllib.parse.urlsplit(path).path
    exact = _EXACT_PATHS.get(path)
    if exact is not None:
        return exact
    for prefix, endpoint in _PATH_PREFIXES:
        if path.startswith(prefix):
            return endpoint
    return Endpoint.OTHER


@dataclass(frozen=True)
class Fault:
    """One injected response (or a dropped connection) in place of Pebble's."""

    status: int | None = None
    """HTTP status, e.g. 429, 503, 500; None only together with ``drop=True``."""
    retry_after: str | None = None
    """``Retry-After`` value sent verbatim (seconds or an HTTP date); None omits it."""
    problem_type: str | None = None
    """When set, the body is an RFC 7807 problem document of this type
    (``application/problem+json``); otherwise it is a short plain-text body."""
    drop: bool = False
    """Close the connection without sending any response."""
    detail: str | None = None
    """The problem document's ``detail`` (e.g. Boulder's exact text); a generic one
    naming the endpoint when None."""
    only_with: str | None = None
    """Answer only requests whose JWS payload has this member (``"replaces"``: a
    renewal's new-order); others pass by, the fault staying queued."""
    only_path: str | None = None
    """Answer only requests for this path (one order's authorization, say)."""

    def __post_init__(self) -> None:
        if self.drop:
            return
        if self.status is None or not 100 <= self.status <= 599:
            raise ValueError(f"a Fault needs drop=True or an HTTP status, not {self.status!r}")

    @classmethod
    def rate_limited(cls, retry_after: str | None = "30") -> Fault:
        """429 with an ACME ``rateLimited`` problem and ``Retry-After``."""
        return cls(429, retry_after, "urn:ietf:params:acme:error:rateLimited")

    @classmethod
    def unavailable(
        cls, retry_after: str | None = None, problem_type: str | None = None
    ) -> Fault:
        """503 Service Unavailable, by default with a plain-text (non-ACME) body."""
        return cls(503, retry_after, problem_type)

    @classmethod
    def server_error(cls, problem_type: str | None = None) -> Fault:
        """500 Internal Server Error, by default with a plain-text (non-ACME) body."""
        return cls(500, None, problem_type)

    @classmethod
    def dropped(cls, only_path: str | None = None) -> Fault:
        """Close the connection without any response (only for ``only_path`` when given)."""
        return cls(drop=True, only_path=only_path)

    @classmethod
    def problem(
        cls, status: int, problem_type: str, detail: str, *, only_with: str | None = None
    ) -> Fault:
        """An ACME problem document with this status, type and detail (Boulder's)."""
        return cls(status, None, problem_type, detail=detail, only_with=only_with)

    def applies_to(self, body: bytes | None, path: str = "") -> bool:
        if self.only_path is not None and urllib.parse.urlsplit(path).path != self.only_path:
            return False
        if self.only_with is None:
            return True
        payload = _jws_payload(body)
        try:
            document = json.loads(payload) if payload else None
        except ValueError:
            return False
        return isinstance(document, dict) and self.only_with in document


@dataclass(frozen=True)
class _RenewalInfo:
    """The ARI answer the proxy serves (RFC 9773 section 4.2)."""

    start: datetime.datetime
    end: datetime.datetime
    retry_after: str | None
    explanation_url: str | None

    def body(self) -> bytes:
        window = {"start": _rfc3339(self.start), "end": _rfc3339(self.end)}
        document: dict[str, Any] = {"suggestedWindow": window}
        if self.explanation_url is not None:
            document["explanationURL"] = self.explanation_url
        return json.dumps(document).encode()


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _whole_seconds_utc(moment: datetime.datetime, name: str) -> datetime.datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, not {moment!r}")
    return moment.astimezone(datetime.timezone.utc).replace(microsecond=0)


@dataclass(frozen=True)
class Forwarded:
    """A request the proxy forwarded to Pebble and Pebble's answer, as given to
    :meth:`FaultProxy.on_forwarded` callbacks (before the answer is relayed)."""

    endpoint: Endpoint
    method: str
    path: str
    """The request target as the client sent it (path and query)."""
    request_body: bytes | None
    status: int
    """Pebble's HTTP status."""
    response_headers: tuple[tuple[str, str], ...]
    response_body: bytes
    identifiers: frozenset[str]
    """For :attr:`Endpoint.NEW_ORDER`: the identifier values asked for
    (lower case, no trailing dot); empty otherwise."""

    @property
    def payload(self) -> bytes | None:
        """The decoded JWS payload of a POST (``b""`` for POST-as-GET), else None."""
        return _jws_payload(self.request_body)

    def header(self, name: str) -> str | None:
        """A response header (case-insensitive), or None."""
        lowered = name.lower()
        return next((v for k, v in self.response_headers if k.lower() == lowered), None)


ForwardedCallback = Callable[[Forwarded], None]


@dataclass(frozen=True)
class Arriving:
    """A request about to be forwarded to Pebble, as given to
    :meth:`FaultProxy.before_forwarding` callbacks."""

    endpoint: Endpoint
    method: str
    path: str
    request_body: bytes | None

    @property
    def payload(self) -> bytes | None:
        """The decoded JWS payload of a POST (``b""`` for POST-as-GET), else None."""
        return _jws_payload(self.request_body)


ArrivingCallback = Callable[[Arriving], None]


def _jws_payload(body: bytes | None) -> bytes | None:
    """The payload of a flattened-JSON JWS, or None when body is not one."""
    if not body:
        return None
    try:
        encoded = json.loads(body)["payload"]
        if not isinstance(encoded, str):
            return None
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None


def _new_order_identifiers(body: bytes | None) -> set[str]:
    """The identifier values a new-order JWS (flattened JSON) asks for."""
    if not body:
        return set()
    try:
        jws = json.loads(body)
        encoded = jws["payload"]
        payload = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        return {
            _normalize_host(str(ident["value"]))
            for ident in payload["identifiers"]
            if isinstance(ident, dict) and "value" in ident
        }
    except (ValueError, KeyError, TypeError, binascii.Error):
        return set()


def _normalize_host(host: str) -> str:
    return host.lower().rstrip(".")


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


class _State:
    """Fault queues and counters, shared by all handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queued: dict[Endpoint, collections.deque[Fault]] = {}
        self.always: dict[Endpoint, Fault] = {}
        self.received: collections.Counter[Endpoint] = collections.Counter()
        self.forwarded: collections.Counter[Endpoint] = collections.Counter()
        self.new_orders: collections.Counter[str] = collections.Counter()
        self.renewal_info: _RenewalInfo | None = None
        self.renewal_info_requests: list[str] = []
        self.hooks: dict[Endpoint, list[ForwardedCallback]] = {}
        self.before: dict[Endpoint, list[ArrivingCallback]] = {}
        self.validation_failures = _ValidationFailures()
        self.limits = _Limits()
        self.owners: dict[str, frozenset[str]] = {}
        """The identifiers each order, authorization, challenge, finalize and
        certificate path is for, learned from Pebble's answers."""
        self.taken: list[tuple[Endpoint, frozenset[str]]] = []
        """Each fault answered, with the identifiers of the request it answered."""

    def receive(self, endpoint: Endpoint, body: bytes | None = None, path: str = "") -> Fault | None:
        """Count a request and return the fault to answer it with, if any."""
        with self.lock:
            self.received[endpoint] += 1
            queue = self.queued.get(endpoint)
            fault = next((f for f in queue or () if f.applies_to(body, path)), None)
            if fault is not None:
                assert queue is not None
                queue.remove(fault)
            else:
                always = self.always.get(endpoint)
                fault = always if always is not None and always.applies_to(body, path) else None
            if fault is not None:
                self.taken.append((endpoint, self._identifiers_of(endpoint, body, path)))
            return fault

    def _identifiers_of(self, endpoint: Endpoint, body: bytes | None, path: str) -> frozenset[str]:
        if endpoint is Endpoint.NEW_ORDER:
            return frozenset(_new_order_identifiers(body))
        return self.owners.get(urllib.parse.urlsplit(path).path, frozenset())

    def learn_owners(self, endpoint: Endpoint, body: bytes | None, path: str, forwarded: Forwarded) -> None:
        """Note which identifiers the URLs in Pebble's answer belong to, so that a
        fault answered later on one of them can be put down to its hostname."""
        if forwarded.status >= 300:
            return
        try:
            document = json.loads(forwarded.response_body)
        except ValueError:
            return
        if not isinstance(document, dict):
            return
        with self.lock:
            if endpoint is Endpoint.NEW_ORDER:
                owners = frozenset(_new_order_identifiers(body))
                urls = [forwarded.header("Location"), document.get("finalize"), *(document.get("authorizations") or [])]
            elif endpoint is Endpoint.AUTHZ:
                identifier = document.get("identifier") or {}
                owners = frozenset({_normalize_host(str(identifier.get("value", "")))}) - {""}
                urls = [c.get("url") for c in document.get("challenges") or [] if isinstance(c, dict)]
            else:
                owners = self.owners.get(urllib.parse.urlsplit(path).path, frozenset())
                urls = [document.get("certificate"), document.get("finalize")]
            if owners:
                for url in urls:
                    if url:
                        self.owners[urllib.parse.urlsplit(str(url)).path] = owners

    def record_forward(self, endpoint: Endpoint, body: bytes | None) -> None:
        identifiers = _new_order_identifiers(body) if endpoint is Endpoint.NEW_ORDER else set()
        with self.lock:
            self.forwarded[endpoint] += 1
            self.new_orders.update(identifiers)

    def hooks_for(self, endpoint: Endpoint) -> list[ForwardedCallback]:
        with self.lock:
            return list(self.hooks.get(endpoint, ()))


# Headers that describe one connection, not the message (RFC 9110 section 7.6.1),
# plus the framing ones the proxy sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


def _relayable(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    named_in_connection = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for token in value.split(",")
    }
    return [
        (name, value)
        for name, value in headers
        if name.lower() not in _HOP_BY_HOP and name.lower() not in named_in_connection
    ]


class _BadRequest(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    timeout = _IDLE_TIMEOUT_S
    # An answer goes out as headers then body: with Nagle's algorithm the body
    # waited for the client's delayed ACK of the headers, 40 ms on every request.
    disable_nagle_algorithm = True
    server: _ProxyServer

    def _handle(self) -> None:
        try:
            body = self._read_body()
        except _BadRequest as exc:
            self.send_error(400, str(exc))
            self.close_connection = True
            return
        endpoint = classify_path(self.path)
        state = self.server.state
        fault = state.receive(endpoint, body, self.path)
        if fault is not None:
            logger.debug("%s %s (%s): injecting %s", self.command, self.path, endpoint, fault)
            self._answer_fault(endpoint, fault)
            return
        with state.lock:
            renewal_info = state.renewal_info
        if renewal_info is not None and endpoint is Endpoint.RENEWAL_INFO:
            self._answer_renewal_info(renewal_info)
            return
        verdict = None
        if endpoint is Endpoint.NEW_ORDER and self.command == "POST":
            with state.lock:
                verdict = state.limits.decide(body, renewal_info)
            if verdict is not None and not verdict.decision.allowed:
                logger.debug("new-order refused by the limits emulator: %s", verdict.decision)
                self._answer_rate_limited(verdict.decision)
                return
        with state.lock:
            before = list(state.before.get(endpoint, ()))
        for callback in before:
            try:
                callback(Arriving(endpoint, self.command, self.path, body))
            except Exception:  # a test's callback must never break the proxy
                logger.exception("faultproxy before_forwarding callback for %s failed", endpoint)
        created = False
        with state.lock:
            held = state.validation_failures.held_accept(endpoint, self.command, self.path, body)
        try:
            response = self._forward(endpoint, body) if held is None else self._answer_held(*held)
            created = response[0] == 201
        except (OSError, http.client.HTTPException) as exc:
            logger.warning("%s %s: Pebble did not answer: %r", self.command, self.path, exc)
            self._send_plain(502, f"faultproxy: upstream error: {exc!r}\n")
            return
        finally:
            if verdict is not None:
                with state.lock:
                    state.limits.settle(verdict, created)
        status, reason, headers, data = response
        with state.lock:
            if held is None:
                data = state.validation_failures.rewrite(endpoint, self.path, data)
            response = (status, reason, headers, data)
            state.limits.observe(endpoint, body, self.path, status, headers, data)
        if renewal_info is not None and endpoint is Endpoint.DIRECTORY and self.command == "GET":
            response = self._advertise_renewal_info(*response)
        forwarded = self._forwarded(endpoint, body, response)
        state.learn_owners(endpoint, body, self.path, forwarded)
        hooks = state.hooks_for(endpoint)
        if hooks:
            self._call_hooks(hooks, endpoint, forwarded)
        self._relay(*response)

    def _forwarded(
        self, endpoint: Endpoint, body: bytes | None, response: tuple[int, str, list[tuple[str, str]], bytes]
    ) -> Forwarded:
        status, _, headers, data = response
        identifiers = (
            frozenset(_new_order_identifiers(body)) if endpoint is Endpoint.NEW_ORDER else frozenset()
        )
        return Forwarded(
            endpoint=endpoint,
            method=self.command,
            path=self.path,
            request_body=body,
            status=status,
            response_headers=tuple(headers),
            response_body=data,
            identifiers=identifiers,
        )

    def _call_hooks(self, hooks: list[ForwardedCallback], endpoint: Endpoint, request: Forwarded) -> None:
        for hook in hooks:
            try:
                hook(request)
            except Exception:  # a test's callback must never break the proxy
                logger.exception("faultproxy on_forwarded callback for %s failed", endpoint)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _handle

    # ------------------------------------------------------------------ request

    def _read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            return None
        try:
            size = int(length)
        except ValueError:
            raise _BadRequest(f"bad Content-Length {length!r}") from None
        if size < 0:
            raise _BadRequest(f"bad Content-Length {length!r}")
        data = self.rfile.read(size)
        if len(data) != size:
            raise _BadRequest("request body cut short")
        return data

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self.rfile.readline(65537)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest("bad chunk size") from None
            if size == 0:
                while self.rfile.readline(65537).strip():  # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline(3)  # CRLF after the chunk

    # ---------------------------------------------------------------- upstream

    def _forward(
        self, endpoint: Endpoint, body: bytes | None
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        server = self.server
        conn = http.client.HTTPSConnection(
            server.upstream_host,
            server.upstream_port,
            context=server.upstream_context,
            timeout=_UPSTREAM_TIMEOUT_S,
        )
        try:
            # Host goes through unchanged: Pebble builds its URLs from it.
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            headers = _relayable(list(self.headers.items()))
            if not any(name.lower() == "host" for name, _ in headers):
                headers.append(("Host", server.netloc))
            for name, value in headers:
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            self.server.state.record_forward(endpoint, body)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def _answer_held(
        self, status: int, document: dict[str, Any], authz_url: str
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """An accept answered here as Pebble would (wfe.go updateChallenge: the
        challenge, Link up to its authorization) or, refused, as Boulder would."""
        content_type = "application/json" if status == 200 else "application/problem+json"
        headers = [("Content-Type", f"{content_type}; charset=utf-8"), ("Link", f'<{authz_url}>;rel="up"')]
        nonce = self.server.fresh_nonce()
        if nonce is not None:
            headers.append(("Replay-Nonce", nonce))
        return status, http.HTTPStatus(status).phrase, headers, json.dumps(document, indent=3).encode()

    def _relay(
        self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes
    ) -> None:
        self.send_response_only(status, reason)  # Pebble's own Date, no Server added
        for name, value in _relayable(headers):
            self.send_header(name, value)
        if self.command == "HEAD":
            length = next((v for k, v in headers if k.lower() == "content-length"), None)
            if length is not None:
                self.send_header("Content-Length", length)
        elif not (status < 200 or status in (204, 304)):
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)

    # ------------------------------------------------------------ renewal info

    def _advertise_renewal_info(
        self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Pebble's directory plus ``renewalInfo`` pointing at this proxy."""
        if status != 200:
            return status, reason, headers, data
        try:
            directory = json.loads(data)
        except ValueError:
            return status, reason, headers, data
        if not isinstance(directory, dict):
            return status, reason, headers, data
        directory["renewalInfo"] = f"https://{self.server.netloc}{RENEWAL_INFO_PATH}"
        return status, reason, headers, json.dumps(directory, indent=3).encode()

    def _answer_renewal_info(self, info: _RenewalInfo) -> None:
        if self.command not in ("GET", "HEAD"):
            self._send_plain(405, "faultproxy: renewalInfo only answers GET\n")
            return
        path = urllib.parse.urlsplit(self.path).path
        cert_id = path[len(RENEWAL_INFO_PATH) + 1 :]
        if not cert_id or "/" in cert_id or "." not in cert_id:
            self._send_plain(400, f"faultproxy: malformed certID {cert_id!r}\n")
            return
        with self.server.state.lock:
            self.server.state.renewal_info_requests.append(cert_id)
        data = info.body()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if info.retry_after is not None:
            self.send_header("Retry-After", info.retry_after)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    # ------------------------------------------------------------------ faults

    def _answer_fault(self, endpoint: Endpoint, fault: Fault) -> None:
        if fault.drop or fault.status is None:
            # Nothing at all goes back; the connection just closes.
            self.close_connection = True
            return
        status = fault.status
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = "Injected"
        if fault.problem_type is not None:
            content_type = "application/problem+json"
            problem = {
                "type": fault.problem_type,
                "detail": fault.detail or f"injected by certflow faultproxy ({endpoint})",
                "status": status,
            }
            data = json.dumps(problem).encode()
        else:
            content_type = "text/plain; charset=utf-8"
            data = f"{status} {phrase} (injected by certflow faultproxy)\n".encode()
        nonce = None
        if self.command == "POST" and endpoint is not Endpoint.NONCE:
            nonce = self.server.fresh_nonce()
        self.send_response(status, phrase)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if fault.retry_after is not None:
            self.send_header("Retry-After", fault.retry_after)
        if nonce is not None:
            self.send_header("Replay-Nonce", nonce)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _answer_rate_limited(self, decision: LimitDecision) -> None:
        """A refusal as Boulder sends it (wfe2/wfe.go sendError, web/send_error.go):
        429, an indented problem document, Retry-After, the help Link and a nonce."""
        problem = {"type": RATE_LIMITED, "detail": decision.detail, "status": 429}
        data = json.dumps(problem, indent=2, ensure_ascii=False).encode()
        nonce = self.server.fresh_nonce()
        self.send_response(429, "Too Many Requests")
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Retry-After", str(decision.retry_after))
        self.send_header("Link", RATE_LIMITS_HELP_LINK)
        if nonce is not None:
            self.send_header("Replay-Nonce", nonce)
        self.end_headers()
        self.wfile.write(data)

    def _send_plain(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        logger.debug("%s - " + format, self.address_string(), *args)


class _ProxyServer(ThreadingHTTPServer):
    """Accepts plain TCP; each handler thread does its own TLS handshake."""

    daemon_threads = True  # stop() closes the connections and joins the threads itself
    block_on_close = False

    def __init__(
        self,
        port: int,
        server_context: ssl.SSLContext,
        upstream_context: ssl.SSLContext,
        upstream_host: str,
        upstream_port: int,
        nonce_path: str,
    ) -> None:
        self.server_context = server_context
        self.upstream_context = upstream_context
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.nonce_path = nonce_path
        self.state = _State()
        self._conn_lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._closing = False
        super().__init__(("127.0.0.1", port), _Handler)
        self.netloc = f"127.0.0.1:{self.server_address[1]}"

    def server_bind(self) -> None:
        # HTTPServer.server_bind would reverse-resolve the address (getfqdn).
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def finish_request(self, request: Any, client_address: Any) -> None:
        raw: socket.socket = request
        # A dup shares the socket: stop() can shut it down under a blocked reader
        # without touching the SSL object that thread is using.
        handle = raw.dup()
        with self._conn_lock:
            if self._closing:
                handle.close()
                return
            self._connections[handle] = threading.current_thread()
        try:
            raw.settimeout(_HANDSHAKE_TIMEOUT_S)
            tls = self.server_context.wrap_socket(raw, server_side=True)
            try:
                _Handler(tls, client_address, self)
            finally:
                tls.close()
        finally:
            with self._conn_lock:
                self._connections.pop(handle, None)
            handle.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Handshake failures, resets and clients vanishing are normal here.
        logger.debug("faultproxy connection from %s ended with an error", client_address,
                     exc_info=True)

    def fresh_nonce(self) -> str | None:
        """A new nonce from Pebble's newNonce (HEAD), or None if Pebble does not answer."""
        conn = http.client.HTTPSConnection(
            self.upstream_host,
            self.upstream_port,
            context=self.upstream_context,
            timeout=_UPSTREAM_TIMEOUT_S,
        )
        try:
            conn.request("HEAD", self.nonce_path, headers={"Host": self.netloc})
            resp = conn.getresponse()
            resp.read()
            return resp.getheader("Replay-Nonce")
        except (OSError, http.client.HTTPException) as exc:
            logger.warning("faultproxy could not fetch a nonce from Pebble: %r", exc)
            return None
        finally:
            conn.close()

    def close_connections(self) -> list[threading.Thread]:
        with self._conn_lock:
            self._closing = True
            connections = list(self._connections.items())
        for handle, _ in connections:
            with contextlib.suppress(OSError):
                handle.shutdown(socket.SHUT_RDWR)
        return [thread for _, thread in connections]


class FaultProxy:
    """A running proxy; see the module docstring. Create it with :func:`start_fault_proxy`."""

    def __init__(self, server: _ProxyServer, directory_path: str) -> None:
        self._server = server
        self._state = server.state
        self.url = f"https://{server.netloc}"
        self.directory_url = self.url + directory_path
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"faultproxy-{server.server_port}",
            daemon=True,
        )
        self._stopped = False

    def __repr__(self) -> str:
        return f"FaultProxy({self.url!r})"

    # ------------------------------------------------------------------ faults

    def inject(self, endpoint: Endpoint, *faults: Fault) -> None:
        """Queue faults: the next ``len(faults)`` requests to ``endpoint`` get them in order.

        Queued faults come before an :meth:`inject_always` fault; once the queue is
        used up, requests pass through again (or get the always-fault).
        """
        with self._state.lock:
            self._state.queued.setdefault(endpoint, collections.deque()).extend(faults)

    def inject_always(self, endpoint: Endpoint, fault: Fault | None) -> None:
        """Answer every request to ``endpoint`` with ``fault`` until cleared (None clears)."""
        with self._state.lock:
            if fault is None:
                self._state.always.pop(endpoint, None)
            else:
                self._state.always[endpoint] = fault

    def pending(self, endpoint: Endpoint) -> int:
        """How many queued faults for ``endpoint`` have not been used yet."""
        with self._state.lock:
            return len(self._state.queued.get(endpoint, ()))

    def fail_validation(
        self, hostname: str, problem_type: str, detail: str, *, takes: float = 0.0
    ) -> None:
        """From now on, the accept of a challenge for ``hostname`` fails validation as
        the CA reports it: that authorization, its challenge (with ``{"type":
        problem_type, "detail": detail, "status": 403}`` as its error) and its order
        read ``invalid`` — after ``takes`` seconds during which they read
        ``pending``, as Boulder shows a challenge under validation.
        :meth:`pass_validation` stops it for later accepts."""
        problem = {"type": problem_type, "detail": detail, "status": 403}
        with self._state.lock:
            self._state.validation_failures.problems[hostname.lower().rstrip(".")] = (
                problem,
                takes,
            )

    def pass_validation(self, hostname: str) -> None:
        """Later accepts for ``hostname`` validate as Pebble decides again."""
        with self._state.lock:
            self._state.validation_failures.problems.pop(hostname.lower().rstrip("."), None)

    def clear(self) -> None:
        """Drop all queued and always-faults (counters stay)."""
        with self._state.lock:
            self._state.queued.clear()
            self._state.always.clear()

    # ------------------------------------------------------------ renewal info

    @property
    def renewal_info_url(self) -> str:
        """The ``renewalInfo`` URL the directory advertises once ARI is served."""
        return self.url + RENEWAL_INFO_PATH

    def serve_renewal_info(
        self,
        window_start: datetime.datetime,
        window_end: datetime.datetime,
        *,
        retry_after: str | None = "3600",
        explanation_url: str | None = None,
    ) -> tuple[datetime.datetime, datetime.datetime]:
        """Act as an ARI server (RFC 9773) from now on.

        The proxied directory then carries ``"renewalInfo":`` :attr:`renewal_info_url`,
        and ``GET <renewal_info_url>/<certID>`` gets ``{"suggestedWindow": {"start",
        "end"}}`` (RFC 3339, UTC, whole seconds) with ``Retry-After: retry_after``
        (None omits it), for any well-formed certID. Clients read the directory
        once, so call this before they start. Calling again changes the window.
        Faults injected for :attr:`Endpoint.RENEWAL_INFO` (e.g. a 503 with
        Retry-After) are answered first. Returns the window as served.
        """
        info = _RenewalInfo(
            start=_whole_seconds_utc(window_start, "window_start"),
            end=_whole_seconds_utc(window_end, "window_end"),
            retry_after=retry_after,
            explanation_url=explanation_url,
        )
        with self._state.lock:
            self._state.renewal_info = info
        return info.start, info.end

    # ------------------------------------------------------------------- hooks

    def on_forwarded(self, endpoint: Endpoint, callback: ForwardedCallback) -> Callable[[], None]:
        """Call ``callback(Forwarded)`` for every request to ``endpoint`` forwarded to
        Pebble, in the proxy's handler thread, after Pebble answered and before the
        answer is relayed (see the module docstring). Returns a function that
        removes this registration."""
        with self._state.lock:
            self._state.hooks.setdefault(endpoint, []).append(callback)

        def remove() -> None:
            with self._state.lock:
                callbacks = self._state.hooks.get(endpoint, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return remove

    def before_forwarding(
        self, endpoint: Endpoint, callback: ArrivingCallback
    ) -> Callable[[], None]:
        """Call ``callback(Arriving)`` for every request to ``endpoint`` about to be
        forwarded to Pebble, in the handler thread, before Pebble sees it (a callback
        that blocks holds the request back). Returns a function that removes it."""
        with self._state.lock:
            self._state.before.setdefault(endpoint, []).append(callback)

        def remove() -> None:
            with self._state.lock:
                callbacks = self._state.before.get(endpoint, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return remove

    def stop_serving_renewal_info(self) -> None:
        """Relay the directory unchanged again and forward renewal-info paths to Pebble."""
        with self._state.lock:
            self._state.renewal_info = None

    def renewal_info_requests(self) -> list[str]:
        """The certIDs of the renewal-info requests answered with a window, in order."""
        with self._state.lock:
            return list(self._state.renewal_info_requests)

    # ------------------------------------------------------------- rate limits

    def emulate_limits(self, config: LimitsConfig | None) -> None:
        """Enforce Let's Encrypt's limits on new orders from now on (None: stop).

        Starts every bucket full and forgets earlier decisions and spends; what the
        proxy saw issued (renewal exemptions, ARI certIDs) is kept. See the module
        docstring for what is checked, spent and exempt."""
        with self._state.lock:
            self._state.limits.reset(config)

    def limit_decisions(self) -> list[LimitDecision]:
        """Every new-order decision since :meth:`emulate_limits`, oldest first."""
        with self._state.lock:
            return list(self._state.limits.decisions)

    def limit_spends(self) -> list[LimitSpend]:
        """Every token taken (and refunded) since :meth:`emulate_limits`, oldest first."""
        with self._state.lock:
            return list(self._state.limits.spends)

    def limit_counts(self) -> collections.Counter[tuple[str, str, str]]:
        """(limit, key, "allowed" | "refused") → how many new orders that bucket let
        through or refused (a bucket refuses only when it decided the refusal)."""
        counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        for decision in self.limit_decisions():
            if not decision.allowed:
                counts[(str(decision.limit), str(decision.key), "refused")] += 1
                continue
            for check in decision.checks:
                counts[(check.limit, check.key, "allowed")] += 1
        return counts

    def limit_remaining(self, limit: str, key: str) -> int | None:
        """Whole tokens in a bucket now (None when that limit is not emulated)."""
        with self._state.lock:
            return self._state.limits.remaining(limit, key)

    def issued_cert_ids(self) -> dict[str, frozenset[str]]:
        """RFC 9773 certID → identifiers of every certificate downloaded through the proxy."""
        with self._state.lock:
            return dict(self._state.limits.cert_ids)

    # ---------------------------------------------------------------- counters

    def count(self, endpoint: Endpoint) -> int:
        """Requests to ``endpoint`` the proxy received (faulted or forwarded)."""
        with self._state.lock:
            return self._state.received[endpoint]

    def forwarded(self, endpoint: Endpoint) -> int:
        """Requests to ``endpoint`` actually sent on to Pebble."""
        with self._state.lock:
            return self._state.forwarded[endpoint]

    def new_orders_for(self, hostname: str) -> int:
        """Forwarded new-order requests whose identifiers include ``hostname``.

        Case and a trailing dot are ignored.
        """
        with self._state.lock:
            return self._state.new_orders[_normalize_host(hostname)]

    def faults_taken(self, endpoint: Endpoint) -> list[frozenset[str]]:
        """For each fault answered on ``endpoint`` so far, the identifiers of the
        request that took it (empty when the request named none the proxy knows:
        an account or ARI request, or a URL it never saw in an answer)."""
        with self._state.lock:
            return [owners for taken_at, owners in self._state.taken if taken_at is endpoint]

    def faults_taken_by(self, hostname: str) -> list[Endpoint]:
        """The endpoints of the faults answered to requests for ``hostname``."""
        host = _normalize_host(hostname)
        with self._state.lock:
            return [endpoint for endpoint, owners in self._state.taken if host in owners]

    def reset_counts(self) -> None:
        """Zero every counter and forget the renewal-info requests seen (faults stay queued)."""
        with self._state.lock:
            self._state.received.clear()
            self._state.forwarded.clear()
            self._state.new_orders.clear()
            self._state.renewal_info_requests.clear()

    # ----------------------------------------------------------------- control

    def _start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop listening, close open client connections and end all threads."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        handlers = self._server.close_connections()
        self._server.server_close()
        self._thread.join(_STOP_JOIN_S)
        for thread in handlers:
            if thread is not threading.current_thread():
                thread.join(_STOP_JOIN_S)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tls_files(pebble: PebbleStack, workdir: Path) -> tuple[Path, Path]:
    for directory in (workdir, pebble.ca_bundle.parent):
        cert, key = directory / "pebble-tls-cert.pem", directory / "pebble-tls-key.pem"
        if cert.is_file() and key.is_file():
            return cert, key
    raise FileNotFoundError(
        f"Pebble's TLS leaf (pebble-tls-cert.pem, pebble-tls-key.pem) is neither in "
        f"{workdir} nor next to {pebble.ca_bundle}"
    )


def start_fault_proxy(
    pebble: PebbleStack, workdir: Path, *, port: int | None = None
) -> FaultProxy:
    """Start a fault proxy in front of ``pebble`` on 127.0.0.1 (``port`` or a free one).

    ``workdir`` is the directory given to ``start_pebble`` (its TLS leaf and key
    are served by the proxy, so ``pebble.ca_bundle`` trusts the proxy too).
    Point clients at :attr:`FaultProxy.directory_url`.
    """
    cert, key = _tls_files(pebble, workdir)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    upstream_context = ssl.create_default_context(cafile=str(pebble.ca_bundle))

    target = urllib.parse.urlsplit(pebble.directory_url)
    if target.hostname is None or target.port is None:
        raise ValueError(f"cannot tell Pebble's address from {pebble.directory_url!r}")
    directory_path = target.path or "/dir"

    # Learn newNonce from Pebble itself (and so check that it answers).
    conn = http.client.HTTPSConnection(
        target.hostname, target.port, context=upstream_context, timeout=_UPSTREAM_TIMEOUT_S
    )
    try:
        conn.request("GET", directory_path)
        resp = conn.getresponse()
        directory: dict[str, Any] = json.loads(resp.read())
    finally:
        conn.close()
    nonce_path = urllib.parse.urlsplit(str(directory["newNonce"])).path

    server = _ProxyServer(
        port or 0, server_context, upstream_context, target.hostname, target.port, nonce_path
    )
    proxy = FaultProxy(server, directory_path)
    proxy._start()
    return proxy
