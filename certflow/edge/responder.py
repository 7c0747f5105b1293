"""The HTTP-01 challenge responder: an ASGI application and a standalone server.

It answers ``GET /.well-known/acme-challenge/<token>`` with the key
authorization of an open challenge whose certificate's hostname is the
request's Host, and 404 for everything else. A product backend can mount
:class:`ChallengeResponder` in its own ASGI app; ``worker.py`` serves it alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import asyncpg
import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from certflow.metrics import CertflowMetrics
from certflow.store import challenges

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CHALLENGE_PREFIX = "/.well-known/acme-challenge/"
# RFC 8555 §8.3: base64url, at least 128 bits of entropy; real tokens are ~43 chars.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")
_HOST = re.compile(r"[a-z0-9.-]{1,253}")
CACHE_SECONDS = 2.0
CACHE_ENTRIES = 10_000
# A CA sends its whole request at once; a client still sending after this long is
# holding a socket, not validating a domain.
REQUEST_RECEIPT_SECONDS = 10.0


def _request_host(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):
                return None  # an IP literal is never a certificate's hostname
            host = host.rsplit(":", 1)[0] if ":" in host else host
            host = host.removesuffix(".")
            return host if _HOST.fullmatch(host) else None
    return None


class ChallengeResponder:
    """ASGI app serving open HTTP-01 challenges from Postgres, with a short cache."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        cache_seconds: float = CACHE_SECONDS,
        metrics: CertflowMetrics | None = None,
    ) -> None:
        self._pool = pool
        self._metrics = metrics or CertflowMetrics()
        self._cache_seconds = cache_seconds
        # Only answers found are cached: a challenge is committed before the CA is
        # told to fetch it, so a miss must always look again.
        self._cache: dict[tuple[str, str], tuple[float, str]] = {}

    async def _lookup(self, token: str, host: str) -> str | None:
        now = time.monotonic()
        hit = self._cache.get((token, host))
        if hit is not None and hit[0] > now:
            return hit[1]
        key_authorization = await challenges.challenge_key_authorization(
            self._pool, token, host
        )
        if key_authorization is not None:
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[(token, host)] = (now + self._cache_seconds, key_authorization)
        return key_authorization

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope.get("path", "")
        token = path[len(CHALLENGE_PREFIX) :] if path.startswith(CHALLENGE_PREFIX) else None
        if token is None or not _TOKEN.fullmatch(token):
            self._metrics.responder_request("not_found")
            await _respond(send, 404, b"not found\n")
            return
        if scope.get("method") not in ("GET", "HEAD"):
            self._metrics.responder_request("method_not_allowed")
            await _respond(send, 405, b"method not allowed\n", allow=b"GET, HEAD")
            return
        host = _request_host(scope)
        body = await self._lookup(token, host) if host else None
        if body is None:
            self._metrics.responder_request("not_found")
            await _respond(send, 404, b"not found\n")
            return
        self._metrics.responder_request("answered")
        payload = body.encode()
        await _respond(send, 200, b"" if scope["method"] == "HEAD" else payload, length=len(payload))


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(
    send: Send, status: int, body: bytes, *, allow: bytes | None = None, length: int | None = None
) -> None:
    headers = [
        (b"content-type", b"text/plain"),
        (b"content-length", str(len(body) if length is None else length).encode()),
        (b"cache-control", b"no-store"),
    ]
    if allow is not None:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with two guards it lacks.

    A request must arrive whole within ``REQUEST_RECEIPT_SECONDS`` of its first
    byte (or of the connection): uvicorn only times out idle keep-alive
    connections, so a client that never finishes its request line, headers or
    body (slowloris) would hold the worker's socket for ever. And when uvicorn
    answers a malformed body with its own 400, the application's response to
    that request is dropped instead of failing inside h11 with a traceback.
    """

    _receipt_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_receipt()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_receipt()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_receipt_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # uvicorn answers this request, not the app
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.close()  # a response is under way: h11 cannot start another
            return
        super().send_400_response(msg)

    def _watch_receipt(self) -> None:
        receiving = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        idle_between_requests = self.timeout_keep_alive_task is not None
        if receiving and not idle_between_requests and not self.transport.is_closing():
            if self._receipt_deadline is None:
                self._receipt_deadline = self.loop.call_later(
                    REQUEST_RECEIPT_SECONDS, self._receipt_overdue
                )
        else:
            self._stop_receipt_deadline()

    def _stop_receipt_deadline(self) -> None:
        if self._receipt_deadline is not None:
            self._receipt_deadline.cancel()
            self._receipt_deadline = None

    def _receipt_overdue(self) -> None:
        self._receipt_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: the hosting process owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind the responder's socket up front, so a taken port is a clear start-up error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off only for sockets that say so, and
    # an answer written in two parts (headers, body) then waits out the client's
    # delayed ACK, 40 ms, on every request after a connection's first.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def responder_server(app: ASGIApp, host: str, port: int) -> uvicorn.Server:
    """A server for app; run it with ``await server.serve(sockets=[bind_listener(...)])``,
    stop it with ``should_exit``."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        http=_GuardedH11Protocol,
        access_log=False,
        log_config=None,  # the host process's logging (JSON lines) applies
        log_level="warning",
        server_header=False,
        date_header=False,
    )
    return _EmbeddedServer(config)
