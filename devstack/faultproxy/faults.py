"""What the fault proxy injects and reports: the ACME endpoints it tells apart, a fault
to answer instead of the CA, and what a hook sees of a request (the package's
docstring says how tests use them)."""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any





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
