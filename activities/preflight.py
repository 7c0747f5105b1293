"""Checks that predict the CA's verdict before an authorization is spent.

:class:`Http01Fetcher` fetches ``http://<hostname>/.well-known/acme-challenge/<token>``
as Let's Encrypt's validation does (SPEC §3.1): the hostname's AAAA and A
records through the configured resolver, every address on port 80 with the
hostname as Host, up to 10 redirects to http or https on ports 80 or 443 only,
https without checking the certificate; the body must be the key authorization.

Two activities use it: ``check_http01`` between persisting a challenge and
accepting it (a failure is HTTP01_UNREACHABLE: never sent to the CA, where each
failed validation costs one of its 5 failed authorizations per hostname per
hour), and ``check_domain``, which runs every pre-check for a hostname without
ordering anything (``starter.py check``).
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import secrets
import socket
import ssl
import time
import urllib.parse
from collections.abc import Awaitable
from dataclasses import dataclass

import asyncpg
from temporalio import activity

from activities.dns_checks import DnsChecker, DnsLookupError
from certflow import certificates
from certflow.errors import CertflowError, DnsCheckError, ErrorCode, to_application_error
from certflow.metrics import CertflowMetrics
from certflow.models import (
    DomainCheck,
    DomainCheckInput,
    DomainCheckReport,
    Http01CheckInput,
)
from certflow.tracing import step_span

CHALLENGE_PATH = "/.well-known/acme-challenge/"
MAX_REDIRECTS = 10  # as Let's Encrypt
REDIRECT_PORTS = {"http": 80, "https": 443}
FETCH_TIMEOUT = 10.0
MAX_BODY = 64 * 1024
_SHOWN = 60


class Http01Unreachable(CertflowError):
    """The challenge could not be fetched as the CA would fetch it."""

    def __init__(self, message: str) -> None:
        super().__init__(code=ErrorCode.HTTP01_UNREACHABLE, message=message)


@dataclass(frozen=True)
class _Answer:
    status: int
    location: str | None
    body: bytes


class _HostHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address, with the hostname as SNI and the certificate unchecked
    (Let's Encrypt follows redirects to https without validating the certificate)."""

    def __init__(self, address: str, port: int, server_name: str, timeout: float) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        super().__init__(address, port, timeout=timeout, context=context)
        self._server_name = server_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._server_name)  # type: ignore[attr-defined]


def _get(scheme: str, address: str, port: int, host: str, target: str, timeout: float) -> _Answer:
    connection: http.client.HTTPConnection
    if scheme == "https":
        connection = _HostHTTPSConnection(address, port, host, timeout)
    else:
        connection = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", host if port == REDIRECT_PORTS[scheme] else f"{host}:{port}")
        connection.putheader("User-Agent", "certflow-http01-check")
        connection.putheader("Accept", "*/*")
        connection.endheaders()
        response = connection.getresponse()
        return _Answer(response.status, response.getheader("Location"), response.read(MAX_BODY))
    finally:
        connection.close()


def _shown(body: bytes) -> str:
    text = body[:_SHOWN].decode("utf-8", "backslashreplace")
    return repr(text) + ("…" if len(body) > _SHOWN else "")


def _where(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class Http01Fetcher:
    """Fetches a challenge the way the CA will; raises Http01Unreachable saying what
    was found (or DnsCheckError ACME_TEMPORARY when the resolver itself fails)."""

    def __init__(self, dns: DnsChecker, port: int = 80, timeout: float = FETCH_TIMEOUT) -> None:
        self._dns = dns
        self.port = port
        self.timeout = timeout

    async def check(self, hostname: str, token: str, key_authorization: str) -> str:
        """Every address of hostname answers the key authorization; what was checked."""
        first_url = f"http://{hostname}{CHALLENGE_PATH}{token}"
        addresses = await self._addresses(hostname)
        if not addresses:
            raise Http01Unreachable(
                f"{hostname} has no A or AAAA record: the CA cannot fetch {first_url}"
            )
        for address in addresses:
            await self._fetch_from(address, hostname, first_url, key_authorization)
        shown = ", ".join(_where(a, self.port) for a in addresses)
        return f"GET http://{hostname}{CHALLENGE_PATH}… answered the key authorization from {shown}"

    async def _addresses(self, name: str) -> list[str]:
        try:
            return await self._dns.lookup_addresses(name)
        except DnsLookupError as err:
            raise DnsCheckError(
                ErrorCode.ACME_TEMPORARY, f"address lookup for {name} failed: {err.reason}"
            ) from err

    async def _fetch_from(
        self, first_address: str, hostname: str, first_url: str, key_authorization: str
    ) -> None:
        url, address, port = first_url, first_address, self.port
        path = f"GET {first_url} from {_where(first_address, self.port)}"
        for hop in range(MAX_REDIRECTS + 1):
            # Once redirected, say which address the failure was at.
            at = f" at {_where(address, port)}" if hop else ""
            parts = urllib.parse.urlsplit(url)
            host = (parts.hostname or "").lower()
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            try:
                answer = await asyncio.to_thread(
                    _get, parts.scheme, address, port, host, target or "/", self.timeout
                )
            except ConnectionRefusedError:
                raise Http01Unreachable(f"{path}: connection refused{at}") from None
            except (TimeoutError, socket.timeout):
                raise Http01Unreachable(f"{path}: no answer{at} within {self.timeout:g} s") from None
            except (OSError, http.client.HTTPException, ssl.SSLError) as err:
                raise Http01Unreachable(f"{path}: {type(err).__name__}{at}: {err}") from None
            if answer.status in (301, 302, 303, 307, 308) and answer.location:
                if hop == MAX_REDIRECTS:
                    raise Http01Unreachable(f"{path}: more than {MAX_REDIRECTS} redirects")
                url = urllib.parse.urljoin(url, answer.location)
                nxt = urllib.parse.urlsplit(url)
                default = REDIRECT_PORTS.get(nxt.scheme)
                if default is None or (nxt.port or default) not in REDIRECT_PORTS.values():
                    raise Http01Unreachable(
                        f"{path} redirected to {url}, which the CA does not follow"
                        " (only http or https on ports 80 and 443)"
                    )
                port = nxt.port or default
                # Where the check runs on another port than 80 (tests: Pebble's
                # HTTP-01 port), every http redirect to port 80 is followed there.
                if nxt.scheme == "http" and self.port != 80 and port == 80:
                    port = self.port
                path += f" redirected to {url}"
                address = await self._redirect_address(nxt.hostname or "", path)
                continue
            answered = f"{path}{at}, which answered" if hop else f"{path} answered"
            if answer.status != 200:
                raise Http01Unreachable(f"{answered} {answer.status}")
            if answer.body.rstrip(b" \t\r\n") != key_authorization.encode():
                raise Http01Unreachable(
                    f"{answered} 200 with {_shown(answer.body)}, not the key authorization"
                )
            return
        raise AssertionError("unreachable")

    async def _redirect_address(self, host: str, path: str) -> str:
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            pass
        found = await self._addresses(host)
        if not found:
            raise Http01Unreachable(f"{path}, but {host} has no A or AAAA record")
        return found[0]


class PreflightActivities:
    """The HTTP-01 self-check before accept, and the whole check of a domain."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        dns: DnsChecker,
        fetcher: Http01Fetcher,
        metrics: CertflowMetrics | None = None,
    ) -> None:
        self._pool = pool
        self._dns = dns
        self._fetcher = fetcher
        self._metrics = metrics or CertflowMetrics()

    @activity.defn(name="check_http01")
    async def check_http01(self, input: Http01CheckInput) -> None:
        """Fetch the persisted challenge as the CA will; HTTP01_UNREACHABLE otherwise."""
        started = time.monotonic()
        try:
            with step_span("http01_check", **{"certificate.hostname": input.hostname}):
                order = await certificates.stored_open_order(self._pool, input.certificate_id)
                if order is None:
                    raise CertflowError(
                        code=ErrorCode.ACME_INVALID_ORDER,
                        message="the certificate row has no open challenge to check",
                    )
                await self._fetcher.check(input.hostname, order.token, order.key_authorization)
        except CertflowError as err:
            self._metrics.step("http01_check", "error", started)
            raise to_application_error(err) from None
        self._metrics.step("http01_check", "ok", started)

    @activity.defn(name="check_domain")
    async def check_domain(self, input: DomainCheckInput) -> DomainCheckReport:
        """CNAME, CAA and reachability of one hostname, each reported, nothing ordered.
        Reachability uses a probe challenge the responder answers for a minute."""
        hostname = input.hostname
        checks: list[DomainCheck] = []

        async def run(name: str, check: Awaitable[str]) -> None:
            try:
                found = await check
            except CertflowError as err:
                checks.append(DomainCheck(name=name, ok=False, code=err.code, message=err.message))
            else:
                checks.append(DomainCheck(name=name, ok=True, message=found))

        await run("cname", self._dns.check_cname(hostname))
        await run("caa", self._dns.check_caa(hostname))
        token = secrets.token_urlsafe(32)
        key_authorization = f"{token}.{secrets.token_urlsafe(32)}"
        await certificates.add_probe(self._pool, hostname, token, key_authorization)
        try:
            await run("http01", self._fetcher.check(hostname, token, key_authorization))
        finally:
            await certificates.remove_probe(self._pool, token)
        return DomainCheckReport(hostname=hostname, checks=checks)
