"""One GET of an HTTP-01 fetch, as Go's transport makes it with Let's Encrypt's
validation authority's pre-resolved dialer (Boulder's ``va/http.go``): one
address, a 10 s dial, TLS without verification on an https redirect, at most
128 bytes of body read.

Failures say which kind they are, because only a dial error falls back to
another address (:class:`DialError`, Boulder's ``fallbackErr``); any other
(:class:`Refused`) ends the fetch. ``http01_fetch`` does the rest.
"""

from __future__ import annotations

import errno
import http.client
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass

from certflow.dns.reserved import IPAddress
from certflow.errors import CertflowError

MAX_RESPONSE_SIZE = 128  # maxResponseSize
DIAL_TIMEOUT = 10.0  # the VA's singleDialTimeout
_USER_AGENT = "certflow-http01-check"


class DialError(CertflowError):
    """Nothing accepted the connection (Go: a net.OpError with Op "dial")."""

    def __init__(self, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


class Refused(CertflowError):
    """The fetch failed for a reason that ends it (no fallback)."""

    def __init__(self, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    status: int
    location: str | None
    body: bytes


def _dial_detail(err: OSError) -> tuple[str, str]:
    if isinstance(err, TimeoutError | socket.timeout):
        return "Timeout during connect (likely firewall problem)", "timeout"
    if err.errno == errno.ECONNREFUSED:
        return "Connection refused", "connection_refused"
    if err.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
        return "Network unreachable", "network_unreachable"
    if err.errno == errno.ECONNRESET:
        return "Connection reset by peer", "connection_reset"
    return "Error getting validation data", "other"


def exchange(
    scheme: str, address: IPAddress, port: int, host: str, target: str, deadline: float
) -> Answer:
    """One GET, as Go's transport with the VA's pre-resolved dialer makes it."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise Refused("Timeout after connect (your server may be slow or overloaded)", "timeout")
    try:
        sock = socket.create_connection((str(address), port), timeout=min(DIAL_TIMEOUT, remaining))
    except OSError as err:
        raise DialError(*_dial_detail(err)) from None
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        if scheme == "https":
            context = ssl.create_default_context()
            context.check_hostname = False  # a server without its certificate yet
            context.verify_mode = ssl.CERT_NONE
            literal = ip_literal(host)
            try:
                sock = context.wrap_socket(sock, server_hostname=None if literal else host)
            except ssl.SSLError as err:
                if "WRONG_VERSION_NUMBER" in str(err) or "wrong version number" in str(err):
                    raise Refused("Server only speaks HTTP, not TLS", "tls") from None
                raise Refused(f"remote error: tls: {err.reason or err}", "tls") from None
        connection = http.client.HTTPConnection(str(address), port)
        connection.sock = sock
        try:
            connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
            connection.putheader("Host", host)
            connection.putheader("User-Agent", _USER_AGENT)
            connection.putheader("Accept", "*/*")
            connection.endheaders()
            response = connection.getresponse()
            body = response.read(MAX_RESPONSE_SIZE) if response.status == 200 else b""
            return Answer(response.status, response.getheader("Location"), body)
        finally:
            connection.close()
    except (TimeoutError, socket.timeout):
        raise Refused(
            "Timeout after connect (your server may be slow or overloaded)", "timeout"
        ) from None
    except http.client.RemoteDisconnected:  # a ConnectionResetError, but Go sees EOF
        raise Refused("Error getting validation data", "other") from None
    except ConnectionResetError:
        raise Refused("Connection reset by peer", "connection_reset") from None
    except (OSError, http.client.HTTPException):
        raise Refused("Error getting validation data", "other") from None
    finally:
        sock.close()


def ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
