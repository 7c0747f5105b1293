"""The fault proxy's HTTPS server: the shared state its handler threads read, each
request classified, faulted, limited or forwarded to Pebble, and the answer relayed."""

from __future__ import annotations

import collections
import contextlib
import http
import http.client
import json
import logging
import socket
import socketserver
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any



from devstack.faultproxy.faults import Arriving, ArrivingCallback, Endpoint, Fault, Forwarded, ForwardedCallback, RENEWAL_INFO_PATH, _HANDSHAKE_TIMEOUT_S, _IDLE_TIMEOUT_S, _RenewalInfo, _UPSTREAM_TIMEOUT_S, _new_order_identifiers, _normalize_host, classify_path
from devstack.faultproxy.limits import LimitDecision, RATE_LIMITED, RATE_LIMITS_HELP_LINK, _Limits, _ValidationFailures

logger = logging.getLogger(__name__)

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
