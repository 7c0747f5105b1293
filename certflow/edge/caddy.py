"""The caddy edge: the certificates held in this process's memory, handed to
Caddy during its handshakes through its ``get_certificate http`` manager
(deploy/caddy/Caddyfile).

Caddy GETs ``/certificate?server_name=…`` and takes HTTP 200 with the chain
then the private key in PEM; anything else is "no certificate from here" (Caddy
2.8 and later read 204 that way; 2.6 logs any status other than 200 as an
error, then tries its next manager). The answer comes from memory only, never a
Postgres query per handshake: the exact name's certificate, else the wildcard
one label up, else 204.

The endpoint hands out private keys, so every request must carry the secret
(``CERTFLOW_EDGE_SECRET``): as the password of HTTP Basic (Caddy cannot add
headers, so its URL carries it as ``http://certflow:SECRET@host:port``) or as a
bearer token. It listens on loopback by default and must never be exposed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import logging
import time
from urllib.parse import parse_qs

import uvicorn

from certflow.edge.maintain import EdgeUnreachableError
from certflow.edge.responder import Receive, Scope, Send, bind_listener, responder_server
from certflow.errors import ConfigError
from certflow.hostnames import parse_host_port

log = logging.getLogger(__name__)

PATH = "/certificate"
REFUSAL_LOG_SECONDS = 60.0
"""At most one line this often about refused requests (a scan must not flood the log)."""
_STARTUP_SECONDS = 10.0


class CaddyTarget:
    """Certificates in memory, served to Caddy over HTTP on ``listen``."""

    def __init__(self, listen: str, secret: str) -> None:
        self.listen = listen
        self._secret = secret.encode()
        self._held: dict[str, bytes] = {}
        """hostname → its answer: the chain (leaf first) then the key, in PEM."""
        self.served = 0
        """Requests answered 200 with a certificate."""
        self.not_held = 0
        """Requests answered 204: no certificate for that name here."""
        self.refused = 0
        """Requests answered 401: no or a wrong secret."""
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._refusal_logged = -REFUSAL_LOG_SECONDS

    # -- EdgeTarget ---------------------------------------------------------------------

    async def put(self, hostname: str, chain_pem: str, key_pem: bytes) -> None:
        body = chain_pem.encode()
        body += b"" if body.endswith(b"\n") else b"\n"
        # One assignment: a handshake meanwhile gets the old pair or the new one.
        self._held[hostname.lower()] = body + key_pem

    async def remove(self, hostname: str) -> bool:
        return self._held.pop(hostname.lower(), None) is not None

    async def held(self) -> set[str]:
        return set(self._held)

    async def restarted(self) -> bool:
        """Never: what is held lives in this process, and Caddy, restarted or
        not, asks for it on every handshake. Checked every poll, though: an
        endpoint that stopped serving is started again, or reported as the edge
        unreachable (the follower's lag then grows, and alerts)."""
        if self._task is None or not self._task.done():
            return False
        log.error("edge: Caddy's endpoint on %s stopped serving; starting it again", self.listen)
        await self.stop()
        try:
            await self.start()
        except ConfigError as err:
            raise EdgeUnreachableError(str(err)) from None
        return False

    async def start(self) -> None:
        """Bind ``listen`` (ConfigError when it cannot) and serve in a task."""
        try:
            host, port = parse_host_port(self.listen)
            sock = bind_listener(host, port)
        except (ValueError, OSError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            raise ConfigError(f"CERTFLOW_EDGE_LISTEN: cannot listen on {self.listen}: {reason}") from None
        if not _loopback(host):
            log.warning(
                "edge: Caddy's endpoint listens on %s, beyond loopback: it hands out private keys,"
                " so nothing but Caddy must reach it (CERTFLOW_EDGE_LISTEN)", self.listen,
            )
        self._server = server = responder_server(self, host, port)
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="caddy-endpoint")
        deadline = time.monotonic() + _STARTUP_SECONDS
        while not server.started:  # the socket already queues connections; this catches a failed start
            if self._task.done() or time.monotonic() > deadline:
                await self.stop()
                raise ConfigError(f"CERTFLOW_EDGE_LISTEN: the endpoint on {self.listen} did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        server, task, self._server, self._task = self._server, self._task, None, None
        if server is None or task is None:
            return
        server.should_exit = True
        try:
            await task
        except Exception as err:  # noqa: BLE001 (stopping: report, never raise)
            log.error("edge: Caddy's endpoint stopped with %s", type(err).__name__)
        log.info(
            "edge: Caddy's endpoint answered %d certificates, %d not held, %d refused",
            self.served, self.not_held, self.refused,
        )

    # -- what Caddy asks ----------------------------------------------------------------

    def lookup(self, server_name: str) -> bytes | None:
        """The PEM answer for a handshake's SNI: its exact name, else the wildcard
        exactly one label up; None for no name, an IP literal or anything else."""
        name = server_name.strip().lower().removesuffix(".")
        labels = name.split(".")
        if len(name) > 253 or len(labels) < 2 or "" in labels or "*" in name or _is_ip(name):
            return None
        found = self._held.get(name)
        if found is None:
            found = self._held.get("*." + ".".join(labels[1:]))
        return found

    def authorized(self, header: bytes | None) -> bool:
        """Basic with the secret as password (any user name), or Bearer the secret."""
        if header is None:
            return False
        scheme, _, credentials = header.strip().partition(b" ")
        credentials = credentials.strip()
        if scheme.lower() == b"basic":
            try:
                decoded = base64.b64decode(credentials, validate=True)
            except (binascii.Error, ValueError):
                return False
            given = decoded.partition(b":")[2]
        elif scheme.lower() == b"bearer":
            given = credentials
        else:
            return False
        return hmac.compare_digest(given, self._secret)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope.get("headers", ()))
        if not self.authorized(headers.get(b"authorization")):
            self.refused += 1
            self._log_refusal(scope)
            await _answer(send, 401, b"a secret is required\n", [(b"www-authenticate", b'Basic realm="certflow"')])
            return
        if scope.get("path") != PATH:
            await _answer(send, 404, b"not found\n")
            return
        if scope.get("method") != "GET":
            await _answer(send, 405, b"GET only\n", [(b"allow", b"GET")])
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        answer = self.lookup(query.get("server_name", [""])[0])
        if answer is None:
            self.not_held += 1
            await _answer(send, 204, None)
            return
        self.served += 1
        await _answer(send, 200, answer, [(b"content-type", b"application/x-pem-file")])

    def _log_refusal(self, scope: Scope) -> None:
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_SECONDS:
            self._refusal_logged = now
            client = scope.get("client") or ("?", 0)
            # Never the header itself: a wrong secret may be a near miss of the right one.
            log.warning(
                "edge: refused a request to Caddy's endpoint from %s without the right secret (%d so far)",
                client[0], self.refused,
            )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


async def _answer(
    send: Send, status: int, body: bytes | None, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    extra = list(headers or [])
    if body is not None:  # a 204 carries neither a body nor its length
        extra.append((b"content-length", str(len(body)).encode()))
        if not any(name == b"content-type" for name, _ in extra):
            extra.append((b"content-type", b"text/plain"))
    extra.append((b"cache-control", b"no-store"))
    await send({"type": "http.response.start", "status": status, "headers": extra})
    await send({"type": "http.response.body", "body": body or b""})
