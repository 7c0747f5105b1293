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

The callback runs in the proxy's handler thread after Pebble answered a
forwarded request and before that answer is relayed to the client, so a
callback that blocks holds the answer back (and one that kills the client
means the client never sees it). Injected faults and the proxy's own ARI
answers are not forwarded, so they do not call hooks. An exception in a
callback is logged and otherwise ignored. Without hooks nothing changes.
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
import socket
import socketserver
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from certflow.dev.devstack import PebbleStack

__all__ = [
    "Endpoint",
    "Fault",
    "FaultProxy",
    "Forwarded",
    "classify_path",
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
    def dropped(cls) -> Fault:
        """Close the connection without any response."""
        return cls(drop=True)


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

    def receive(self, endpoint: Endpoint) -> Fault | None:
        """Count a request and return the fault to answer it with, if any."""
        with self.lock:
            self.received[endpoint] += 1
            queue = self.queued.get(endpoint)
            if queue:
                return queue.popleft()
            return self.always.get(endpoint)

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
        fault = state.receive(endpoint)
        if fault is not None:
            logger.debug("%s %s (%s): injecting %s", self.command, self.path, endpoint, fault)
            self._answer_fault(endpoint, fault)
            return
        with state.lock:
            renewal_info = state.renewal_info
        if renewal_info is not None and endpoint is Endpoint.RENEWAL_INFO:
            self._answer_renewal_info(renewal_info)
            return
        try:
            response = self._forward(endpoint, body)
        except (OSError, http.client.HTTPException) as exc:
            logger.warning("%s %s: Pebble did not answer: %r", self.command, self.path, exc)
            self._send_plain(502, f"faultproxy: upstream error: {exc!r}\n")
            return
        if renewal_info is not None and endpoint is Endpoint.DIRECTORY and self.command == "GET":
            response = self._advertise_renewal_info(*response)
        hooks = state.hooks_for(endpoint)
        if hooks:
            self._call_hooks(hooks, endpoint, body, response)
        self._relay(*response)

    def _call_hooks(
        self,
        hooks: list[ForwardedCallback],
        endpoint: Endpoint,
        body: bytes | None,
        response: tuple[int, str, list[tuple[str, str]], bytes],
    ) -> None:
        status, _, headers, data = response
        identifiers = (
            frozenset(_new_order_identifiers(body)) if endpoint is Endpoint.NEW_ORDER else frozenset()
        )
        request = Forwarded(
            endpoint=endpoint,
            method=self.command,
            path=self.path,
            request_body=body,
            status=status,
            response_headers=tuple(headers),
            response_body=data,
            identifiers=identifiers,
        )
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
                "detail": f"injected by certflow faultproxy ({endpoint})",
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

    def stop_serving_renewal_info(self) -> None:
        """Relay the directory unchanged again and forward renewal-info paths to Pebble."""
        with self._state.lock:
            self._state.renewal_info = None

    def renewal_info_requests(self) -> list[str]:
        """The certIDs of the renewal-info requests answered with a window, in order."""
        with self._state.lock:
            return list(self._state.renewal_info_requests)

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
