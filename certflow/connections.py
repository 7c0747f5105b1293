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

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from certflow.errors import ServiceUnreachableError
from certflow.store.db import create_pool

CONNECT_TIMEOUT_SECONDS = 8.0
"""Per service: a CLI command that reaches neither still ends well inside 10 s of
its start when one of them is quick to refuse."""

DATABASE_SETTING = "CERTFLOW_DATABASE_URL"
TEMPORAL_SETTING = "CERTFLOW_TEMPORAL_ADDRESS"


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
    """A pool (see :func:`create_pool`), or ServiceUnreachableError within ``timeout``."""
    address = redact_url(url)
    try:
        return await asyncio.wait_for(create_pool(url, max_size=max_size, timeout=timeout), timeout + 1)
    except asyncpg.PostgresError as err:  # it answered: wrong password, no such database
        raise ServiceUnreachableError(
            "Postgres", address, DATABASE_SETTING, str(err).splitlines()[0], reached=True
        ) from None
    except (OSError, asyncio.TimeoutError, asyncpg.InterfaceError) as err:
        reason = _network_reason(err, timeout) or str(err).splitlines()[0]
        raise ServiceUnreachableError("Postgres", address, DATABASE_SETTING, reason) from None


_TEMPORAL_REASONS = (
    (re.compile(r"connection ?refused", re.I), "connection refused"),
    (re.compile(r"dns error|failed to lookup address", re.I), "the name does not resolve (DNS)"),
    (re.compile(r"\btls\b|certificate|handshake", re.I), "TLS failed"),
    (re.compile(r"timed? ?out", re.I), "no answer in time"),
    (re.compile(r"get_system_info", re.I), "it answered, but not as a Temporal frontend"),
)


def _temporal_reason(message: str) -> str:
    """The SDK's connect error (a Rust error's debug text) as one plain reason."""
    for pattern, reason in _TEMPORAL_REASONS:
        if pattern.search(message):
            return reason
    return message.removeprefix("Failed client connect: ").splitlines()[0][:200]


async def open_temporal(
    address: str, namespace: str, *, timeout: float = CONNECT_TIMEOUT_SECONDS
) -> Client:
    """A Temporal client (pydantic payloads), or ServiceUnreachableError within ``timeout``."""
    try:
        return await asyncio.wait_for(
            Client.connect(address, namespace=namespace, data_converter=pydantic_data_converter),
            timeout,
        )
    except asyncio.TimeoutError:
        raise ServiceUnreachableError(
            "Temporal", address, TEMPORAL_SETTING, f"no answer within {timeout:g} s"
        ) from None
    except RuntimeError as err:  # the SDK's "Failed client connect: …"
        raise ServiceUnreachableError(
            "Temporal", address, TEMPORAL_SETTING, _temporal_reason(str(err))
        ) from None
