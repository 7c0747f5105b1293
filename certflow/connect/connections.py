"""Connecting to Postgres and Temporal within a bound.

A client (the CLI, a product backend) that cannot reach either gets one
:class:`ServiceUnreachableError` naming the service, the address (the URL's
password never shown) and the setting to check, within
:data:`CONNECT_TIMEOUT_SECONDS` — instead of a traceback or a hang.
"""

from __future__ import annotations

import asyncio
import errno
import re
import socket
import ssl
import urllib.parse
from collections.abc import Sequence

import asyncpg
from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from certflow.errors import ServiceUnreachableError
from certflow.store.db import create_pool
from certflow.connect.temporal_config import TemporalConnection

CONNECT_TIMEOUT_SECONDS = 8.0
"""Per service: a CLI command that reaches neither still ends well inside 10 s of
its start when one of them is quick to refuse."""

DATABASE_SETTING = "CERTFLOW_DATABASE_URL"


def redact_url(url: str) -> str:
    """The URL without its password (in the user part or a ``password`` parameter)."""
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.partition(':')[0]}@{host}"
        query = urllib.parse.urlencode(
            [
                (k, "***" if "password" in k.lower() else v)
                for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
            ],
            safe="/*",
        )
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "(the URL cannot be parsed)"


def _network_reason(err: BaseException, timeout: float) -> str | None:
    """What an OS-level failure means to an operator; None when it is none."""
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return f"no answer within {timeout:g} s"
    if isinstance(err, socket.gaierror):
        return f"the name does not resolve (DNS: {err.strerror})"
    if isinstance(err, ssl.SSLCertVerificationError):
        detail = (err.verify_message or err.reason or "certificate verify failed").rstrip(".")
        if err.verify_code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH
            return (
                f"TLS failed: the server's certificate does not name the host ({detail});"
                " check the host: verify-full needs it in the certificate"
            )
        if err.verify_code in (9, 10):  # X509_V_ERR_CERT_NOT_YET_VALID, _HAS_EXPIRED
            return f"TLS failed: the server's certificate is not valid now ({detail})"
        if err.verify_code in (2, 7, 18, 19, 20, 21):  # no path to a root in sslrootcert
            return (
                f"TLS failed: the server's certificate is not signed by the CA in sslrootcert"
                f" ({detail}); check sslrootcert"
            )
        return f"TLS failed: the server's certificate was refused ({detail}); check sslrootcert"
    if isinstance(err, ssl.SSLError):
        return f"TLS failed: {err.reason or err}"
    if isinstance(err, ConnectionError) and "ssl" in str(err).lower():  # asyncpg's own
        return f"TLS failed: {err}"
    if isinstance(err, ConnectionRefusedError) or getattr(err, "errno", None) == errno.ECONNREFUSED:
        return "connection refused"
    if isinstance(err, OSError):
        return (err.strerror or str(err) or type(err).__name__).lower()
    return None


async def open_postgres(
    url: str, *, max_size: int, timeout: float = CONNECT_TIMEOUT_SECONDS
) -> asyncpg.Pool:
    """A pool (see :func:`create_pool`), or ServiceUnreachableError within ``timeout``.

    Over TLS the reason names the URL parameter to check: ``sslmode`` when the
    server accepts TLS only, ``sslrootcert`` when its certificate does not verify,
    ``sslcert``/``sslkey`` when it wants a client certificate or they cannot be read."""
    address = redact_url(url)
    try:
        return await asyncio.wait_for(create_pool(url, max_size=max_size, timeout=timeout), timeout + 1)
    except asyncpg.PostgresError as err:  # it answered: wrong password, no such database
        reason = str(err).splitlines()[0]
        if reason.endswith(", no encryption"):  # pg_hba.conf: hostssl lines only
            reason += "; the server accepts TLS only: check sslmode (verify-full, with sslrootcert)"
        elif "client certificate" in reason or reason.startswith("certificate authentication failed"):
            reason += "; check sslcert and sslkey"
        raise ServiceUnreachableError("Postgres", address, DATABASE_SETTING, reason, reached=True) from None
    except (OSError, asyncio.TimeoutError, asyncpg.InterfaceError) as err:
        reason = None
        # asyncpg loads sslrootcert, sslcert and sslkey before it connects.
        if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)) or (
            isinstance(err, ssl.SSLError)
            and not isinstance(err, ssl.SSLCertVerificationError)
            and (err.library in ("X509", "PEM") or "PEM lib" in str(err))
        ):
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
            for name in ("sslrootcert", "sslcert", "sslkey"):
                for path in query.get(name, []):
                    try:
                        open(path, "rb").close()
                    except OSError as unreadable:
                        reason = reason or f"cannot read {name} {path} ({(unreadable.strerror or '').lower()})"
            if reason is None and isinstance(err, ssl.SSLError):
                reason = (
                    "sslkey is not the key of sslcert"
                    if err.reason == "KEY_VALUES_MISMATCH"
                    else f"cannot load sslrootcert, sslcert or sslkey ({err.reason or err})"
                )
        reason = reason or _network_reason(err, timeout) or str(err).splitlines()[0]
        reached = isinstance(err, ssl.SSLCertVerificationError)  # it answered, with its certificate
        raise ServiceUnreachableError(
            "Postgres", address, DATABASE_SETTING, reason, reached=reached
        ) from None


_TLS_REFUSALS = (
    # rustls' words for the server's certificate, then the server's alerts about ours.
    (re.compile(r"UnknownIssuer|BadSignature|unknown ca", re.I), "the server's certificate is not signed by the CA of {ca}"),
    (re.compile(r"NotValidForName|CertNotValidForName", re.I), "the server's certificate is not valid for the name the client expects ({name})"),
    (re.compile(r"Expired|NotValidYet", re.I), "the server's certificate is expired or not yet valid"),
    (
        re.compile(r"CertificateRequired|certificate required|BadCertificate|bad certificate|"
                   r"UnknownCA|unknown_ca|HandshakeFailure|handshake failure|DecryptError", re.I),
        "the server refused the handshake: a client certificate missing, or not one it trusts ({cert})",
    ),
    (re.compile(r"CorruptMessage|InvalidContentType|wrong version|record overflow", re.I),
     "the server does not speak TLS there ({tls})"),
)
_TEMPORAL_REASONS = (
    (re.compile(r"connection ?refused", re.I), "connection refused"),
    (re.compile(r"dns error|failed to lookup address", re.I), "the name does not resolve (DNS)"),
    (re.compile(r"timed? ?out", re.I), "no answer in time"),
    (re.compile(r"get_system_info", re.I), "it answered, but not as a Temporal frontend"),
)


_REFUSED_CREDENTIALS = re.compile(
    r"\b(401 Unauthorized|403 Forbidden)|code: (Unauthenticated|PermissionDenied)", re.I
)
_CLOSED_AFTER_HANDSHAKE = re.compile(
    r"after connection.*(connection closed|broken pipe|connection reset|transport error|Cancelled)", re.I | re.S
)


def _credentials_refused(status: str, connection: TemporalConnection) -> str:
    if connection.api_key_setting is not None:
        return f"the API key was refused ({status}); check {connection.api_key_setting}"
    if connection.client_cert_setting is not None:
        return f"the client certificate was refused ({status}); check {connection.client_cert_setting}"
    return f"it asks for credentials ({status}): set an API key or a client certificate"


def _temporal_reason(message: str, connection: TemporalConnection) -> str:
    """The SDK's connect error (a Rust error's debug text) as one plain reason that
    names the settings to check."""
    if refused := _REFUSED_CREDENTIALS.search(message):
        return _credentials_refused(refused.group(0).removeprefix("code: "), connection)
    if connection.tls is not None:
        names = {
            "ca": connection.ca_setting or "the system's roots",
            "name": f"{connection.tls.domain}, {connection.server_name_setting}"
            if connection.tls.domain
            else f"the address's host; check {connection.address_setting}",
            "cert": connection.client_cert_setting
            or "none is configured: set CERTFLOW_TEMPORAL_TLS_CERT and CERTFLOW_TEMPORAL_TLS_KEY",
            "tls": "TLS is on; check " + connection.address_setting,
        }
        for pattern, reason in _TLS_REFUSALS:
            if pattern.search(message):
                return reason.format(**names)
        if _CLOSED_AFTER_HANDSHAKE.search(message):
            # TLS 1.3: the server checks the client's certificate after the
            # handshake, and closes the connection on the first call.
            return (
                "the server closed the connection after the TLS handshake: a client certificate"
                f" missing, or not one it trusts ({names['cert']})"
            )
    elif _CLOSED_AFTER_HANDSHAKE.search(message):
        return (
            "it closed the connection at the first call: does it need TLS"
            " (CERTFLOW_TEMPORAL_TLS=true, an API key or a client certificate)?"
        )
    for pattern, reason in _TEMPORAL_REASONS:
        if pattern.search(message):
            return reason
    if re.search(r"\btls\b|certificate|handshake|transport error", message, re.I):
        if connection.tls is None:
            return (
                "it does not answer plaintext gRPC: does it need TLS (CERTFLOW_TEMPORAL_TLS,"
                " an API key or a client certificate)?"
            )
        return "the TLS connection failed; check " + ", ".join(connection.tls_settings)
    return message.removeprefix("Failed client connect: ").splitlines()[0][:200]


def _refused_credentials(err: RPCError, connection: TemporalConnection) -> str | None:
    """What an answered-but-refused connect means: a rejected API key or identity."""
    if err.status not in (RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.PERMISSION_DENIED):
        return None
    return _credentials_refused(err.status.name.lower(), connection)


async def open_temporal(
    connection: TemporalConnection,
    *,
    data_converter: DataConverter = pydantic_data_converter,
    timeout: float = CONNECT_TIMEOUT_SECONDS,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Client:
    """A Temporal client, or ServiceUnreachableError within ``timeout`` naming the
    address and the setting to check."""

    def unreachable(reason: str, setting: str = connection.address_setting) -> ServiceUnreachableError:
        return ServiceUnreachableError("Temporal", connection.address, setting, reason)

    try:
        return await asyncio.wait_for(
            Client.connect(
                connection.address,
                namespace=connection.namespace,
                api_key=connection.api_key,
                tls=connection.tls if connection.tls is not None else False,
                rpc_metadata=dict(connection.rpc_metadata),
                data_converter=data_converter,
                runtime=runtime,
                interceptors=interceptors,
            ),
            timeout,
        )
    except asyncio.TimeoutError:
        raise unreachable(f"no answer within {timeout:g} s") from None
    except RPCError as err:
        reason = _refused_credentials(err, connection)
        if reason is None:
            reason = _temporal_reason(err.message, connection)
        raise unreachable(reason) from None
    except RuntimeError as err:  # the SDK's "Failed client connect: …"
        raise unreachable(_temporal_reason(str(err), connection)) from None
