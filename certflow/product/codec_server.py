"""``certflow codec-server``: Temporal's remote codec protocol over HTTP, so that the
Web UI (its "Codec Server" setting) and ``temporal workflow show
--codec-endpoint`` show the payloads certflow encrypts (certflow/connect/payload_codec.py).

``POST /decode`` and ``POST /encode`` take and answer ``{"payloads": [...]}``,
each payload in protobuf's JSON form. Only operators decode: every POST needs
``Authorization: Bearer <CERTFLOW_CODEC_SECRET>`` when a secret is set, and a
client certificate from ``CERTFLOW_CODEC_TLS_CLIENT_CA`` when that is set (the
TLS layer refuses the connection otherwise). A browser's CORS preflight is
answered for the origins in ``CERTFLOW_CODEC_CORS_ORIGINS`` without credentials,
as browsers send none on it.
"""

from __future__ import annotations

import hmac
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from certflow.errors import ConfigError
from certflow.connect.payload_codec import EncryptionCodec, PayloadKeyError
from certflow.hostnames import parse_host_port
from certflow.connect.settings import CodecServerSettings

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MAX_BODY_BYTES = 16 * 1024 * 1024
"""A history's batch of payloads; Temporal's own limit is 2 MiB a payload."""
_ALLOWED_HEADERS = b"Authorization, Content-Type, X-Namespace"

log = logging.getLogger(__name__)


class CodecServer:
    """The ASGI application."""

    def __init__(
        self, codec: EncryptionCodec, *, secret: str | None, cors_origins: frozenset[str] = frozenset()
    ) -> None:
        self._codec = codec
        self._expected = None if secret is None else f"Bearer {secret}".encode()
        self._origins = cors_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {name.lower(): value for name, value in scope.get("headers", ())}
        cors = self._cors(headers.get(b"origin"))
        path = scope["path"].rstrip("/")
        if scope["method"] == "OPTIONS":
            await _answer(send, 204 if cors else 403, b"", cors)
            return
        if scope["method"] != "POST" or path not in ("/decode", "/encode"):
            await _answer(send, 404, _error("POST /decode or /encode"), cors)
            return
        if not self._authorized(headers.get(b"authorization")):
            await _answer(
                send, 401, _error("a bearer secret is required"), [*cors, (b"www-authenticate", b"Bearer")]
            )
            return
        body = await _body(receive)
        if body is None:
            await _answer(send, 413, _error(f"the body is over {MAX_BODY_BYTES} bytes"), cors)
            return
        try:
            payloads = json_format.Parse(body, Payloads(), ignore_unknown_fields=True)
        except (json_format.ParseError, UnicodeDecodeError) as err:
            await _answer(send, 400, _error(f"not a JSON Payloads document: {err}"), cors)
            return
        try:
            if path == "/decode":
                done = await self._codec.decode(payloads.payloads)
            else:
                done = await self._codec.encode(payloads.payloads)
        except PayloadKeyError as err:
            await _answer(send, 400, _error(str(err)), cors)
            return
        answer = json.dumps({"payloads": [json_format.MessageToDict(p) for p in done]}).encode()
        await _answer(send, 200, answer, cors)

    def _authorized(self, given: bytes | None) -> bool:
        if self._expected is None:  # client certificates only: the TLS layer checked them
            return True
        return given is not None and hmac.compare_digest(given.strip(), self._expected)

    def _cors(self, origin: bytes | None) -> list[tuple[bytes, bytes]]:
        if origin is None or origin.decode("latin-1").rstrip("/") not in self._origins:
            return []
        return [
            (b"access-control-allow-origin", origin),
            (b"access-control-allow-credentials", b"true"),
            (b"access-control-allow-methods", b"POST, OPTIONS"),
            (b"access-control-allow-headers", _ALLOWED_HEADERS),
            (b"access-control-max-age", b"600"),
            (b"vary", b"Origin"),
        ]


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _body(receive: Receive) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": base + headers})
    await send({"type": "http.response.body", "body": body})


def codec_server(settings: CodecServerSettings) -> uvicorn.Server:
    """The server the settings describe; run it with ``await server.serve()``."""
    host, port = parse_host_port(settings.codec_listen)
    codec = EncryptionCodec(settings.payload_key_pair, settings.old_payload_key_pairs)
    secret = None if settings.codec_secret is None else settings.codec_secret.get_secret_value().strip()
    app = CodecServer(codec, secret=secret, cors_origins=settings.cors_origins)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="warning",
        server_header=False,
        ssl_certfile=settings.codec_tls_cert,
        ssl_keyfile=settings.codec_tls_key,
        ssl_ca_certs=settings.codec_tls_client_ca,
        ssl_cert_reqs=ssl.CERT_REQUIRED if settings.codec_tls_client_ca else ssl.CERT_NONE,
    )
    try:
        config.load()  # reads the TLS files now, so a bad one is a ConfigError
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(
            "CERTFLOW_CODEC_TLS_CERT, _KEY or _CLIENT_CA: cannot be loaded:"
            f" {getattr(err, 'strerror', None) or err}"
        ) from None
    return uvicorn.Server(config)
