"""Fetching an HTTP-01 challenge exactly as Let's Encrypt's validation authority does.

Boulder is the specification (``va/http.go`` ``processHTTPValidation``,
``setupHTTPValidation``, ``extractRequestTarget``, ``fallbackErr``;
``va/dns.go`` ``getAddrs``; ``va/va.go`` ``detailedError``):

- A and AAAA are looked up together; the fetch fails on DNS only when *both*
  fail (a SERVFAIL, a timeout, no records, or only reserved addresses).
  Reserved addresses (:mod:`certflow.dns.reserved`) are dropped.
- One address is tried: the first AAAA, else the first A. Only a *dial* error
  (nothing accepted the connection) on it — anywhere in the redirect chain —
  falls back, once, to the first A, and the whole fetch starts over from the
  first URL; the URLs already seen still count for loop detection and the
  redirects already followed still count toward the limit, as at the CA.
- Redirects: 301, 302, 307 and 308 are followed (303 is refused, other codes
  are a non-200 answer); the check runs before counting, so 11 are followed and
  the 12th is refused. A target must be http or https, an explicit port 80 or
  443 (the CA's HTTP port here is ``port``), a host that is not empty, does not
  end in ``.well-known``, is under an IANA TLD (the ICANN section of the public
  suffix list) or is an IP literal outside the reserved blocks; a path of at
  most 2,000 bytes; a URL not seen before.
- The body is read up to 128 bytes (128 or more is refused), trailing Unicode
  white space trimmed (Go's ``unicode.IsSpace``), and compared byte for byte.

Each GET is ``http01_exchange``'s. A failure is :class:`Http01Unreachable`
carrying the CA's own detail text for it (``203.0.113.7: Fetching http://…:
Connection refused``) and a short ``reason`` for metrics. Multi-perspective
validation (Let's Encrypt also fetches from remote vantage points) is not
modelled: one vantage point, the worker's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
import urllib.parse
from dataclasses import dataclass, field
from functools import cache

from publicsuffixlist import PublicSuffixList

from certflow.dns.checks import DnsChecker
from certflow.dns.http01_exchange import (
    MAX_RESPONSE_SIZE,
    Answer,
    DialError,
    Refused,
    exchange,
    ip_literal,
)
from certflow.dns.lookup import DnsLookupError
from certflow.errors import ProvisioningError, ErrorCode
from certflow.dns.reserved import AddressPolicy, IPAddress

CHALLENGE_PATH = "/.well-known/acme-challenge/"
MAX_REDIRECTS = 10  # maxRedirect
MAX_PATH_SIZE = 2000  # maxPathSize
FETCH_DEADLINE = 20.0
"""The whole fetch, every hop and the fallback included (the CA's validation
deadline; Boulder's comes from its RPC timeout)."""
HTTPS_PORT = 443
ALLOWED_REDIRECTS = frozenset({301, 302, 307, 308})
_GO_REDIRECTS = frozenset({301, 302, 303, 307, 308})
"""The codes Go's HTTP client treats as redirects (and asks the VA's policy about)."""

# Go's unicode.IsSpace: Latin-1 space characters and the Unicode White_Space property.
_GO_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


class Http01Unreachable(ProvisioningError):
    """The challenge could not be fetched as the CA would fetch it."""

    def __init__(self, message: str, reason: str = "other") -> None:
        super().__init__(code=ErrorCode.HTTP01_UNREACHABLE, message=message)
        self.reason = reason
        """A short label for what failed (metrics): dns, connection_refused,
        network_unreachable, connection_reset, timeout, tls, redirect, status,
        body_too_large, wrong_body, other."""

    def details(self) -> dict[str, object]:
        return {**super().details(), "reason": self.reason}


@dataclass
class _Target:
    """Where one URL is fetched from: Boulder's httpValidationTarget."""

    host: str
    port: int
    next: list[IPAddress]
    current: IPAddress | None = None

    def advance(self) -> bool:
        if not self.next:
            return False
        self.current, self.next = self.next[0], self.next[1:]
        return True


@dataclass
class _Validation:
    """What one validation has seen so far, across the fallback (Boulder keeps its
    ``records`` and ``numRedirects`` in the closure both tries share)."""

    seen_urls: list[str] = field(default_factory=list)
    redirects: int = 0
    last_address: IPAddress | None = None
    fetched_from: list[str] = field(default_factory=list)


@cache
def _icann_suffixes() -> PublicSuffixList:
    return PublicSuffixList(only_icann=True, accept_unknown=False)


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string, near enough for messages."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}")
    out.append('"')
    return "".join(out)


def trimmed_payload(body: bytes) -> bytes:
    """The body as the VA compares it: trailing white space (Go's ``unicode.IsSpace``)
    removed; bytes that are not UTF-8 are kept as they are (never space)."""
    text = body.decode("utf-8", "surrogateescape")
    end = len(text)
    while end and text[end - 1] in _GO_SPACE:
        end -= 1
    return text[:end].encode("utf-8", "surrogateescape")


def _where(address: IPAddress, port: int) -> str:
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def _host_header(parts: urllib.parse.SplitResult) -> str:
    """Go's Host header: the URL's host, with its port only when the URL names one."""
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port}" if parts.port is not None else host


class Http01Fetcher:
    """Fetches a challenge the way the CA will (module docstring); raises
    :class:`Http01Unreachable` saying what the CA would say."""

    def __init__(
        self,
        dns: DnsChecker,
        port: int = 80,
        addresses: AddressPolicy = AddressPolicy(),
        deadline_seconds: float = FETCH_DEADLINE,
    ) -> None:
        self._dns = dns
        self.port = port
        """The CA's HTTP port: 80 (a test rig's CA may validate on another)."""
        self.addresses = addresses
        self.deadline_seconds = deadline_seconds

    async def check(self, hostname: str, token: str, key_authorization: str) -> str:
        """Fetch the challenge; what answered when it matched the key authorization."""
        url = f"http://{hostname}{CHALLENGE_PATH}{token}"
        deadline = time.monotonic() + self.deadline_seconds
        target = await self._target(hostname, self.port)
        seen = _Validation()
        try:
            try:
                body = await self._fetch(url, target, seen, deadline)
            except DialError as err:
                # Only a dial error falls back (fallbackErr), once, to the first A.
                if not target.advance():
                    raise
                seen.fetched_from.append(f"{seen.last_address} did not connect: {err.detail}")
                body = await self._fetch(url, target, seen, deadline)
        except (DialError, Refused) as err:
            prefix = f"{seen.last_address}: " if seen.last_address is not None else ""
            raise Http01Unreachable(prefix + err.detail, err.reason) from None
        payload = trimmed_payload(body)
        if payload != key_authorization.encode():
            raise Http01Unreachable(
                "The key authorization file from the server did not match this challenge."
                f" Expected {go_quote(key_authorization)}"
                f" (got {go_quote(payload.decode('utf-8', 'replace'))})",
                "wrong_body",
            )
        return f"GET {url} answered the key authorization ({'; '.join(seen.fetched_from)})"

    async def _target(self, host: str, port: int) -> _Target:
        """The addresses to try for host: the first AAAA with the first A as its
        fallback, or the one family there is (``getAddrs`` and
        ``newHTTPValidationTarget``). Raises Http01Unreachable for DNS."""
        literal = ip_literal(host)
        if literal is not None:
            target = _Target(host, port, [literal])
            target.advance()
            return target
        v4, v6 = await asyncio.gather(self._family(host, "A"), self._family(host, "AAAA"))
        if isinstance(v4, str) and isinstance(v6, str):
            raise Http01Unreachable(f"{v4}; {v6}", "dns")
        first = [found[0] for found in (v6, v4) if not isinstance(found, str)]
        target = _Target(host, port, first)
        target.advance()
        return target

    async def _family(self, host: str, rdtype: str) -> list[IPAddress] | str:
        """The usable addresses of one family, or the CA's words for why there are none."""
        try:
            found = await self._dns.lookup_addresses(host, rdtype)
        except DnsLookupError as err:
            return err.ca_detail
        usable = []
        for text in found:
            address = ipaddress.ip_address(text)
            if self.addresses.refusal(address) is None:
                usable.append(address)
        return usable or f"no valid {rdtype} records found for {host}"

    async def _fetch(self, url: str, target: _Target, seen: _Validation, deadline: float) -> bytes:
        """Follow url from target's current address through its redirects; the body
        of the 200 that ends it."""
        assert target.current is not None
        address, port = target.current, target.port
        seen.seen_urls.append(url)
        seen.last_address = address
        while True:
            parts = urllib.parse.urlsplit(url)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            try:
                answer = await asyncio.to_thread(
                    exchange, parts.scheme, address, port, _host_header(parts), path, deadline
                )
            except DialError as err:
                raise DialError(f"Fetching {url}: {err.detail}", err.reason) from None
            except Refused as err:
                raise Refused(f"Fetching {url}: {err.detail}", err.reason) from None
            if answer.status in _GO_REDIRECTS and answer.location:
                url, address, port = await self._redirect(url, answer, seen, deadline)
                continue
            if answer.status != 200:
                raise Refused(f"Invalid response from {url}: {answer.status}", "status")
            if len(answer.body) >= MAX_RESPONSE_SIZE:
                raise Refused(
                    f"Invalid response from {url}: {go_quote(answer.body.decode('utf-8', 'replace'))}",
                    "body_too_large",
                )
            seen.fetched_from.append(f"from {_where(address, port)}")
            return answer.body

    async def _redirect(
        self, url: str, answer: Answer, seen: _Validation, deadline: float
    ) -> tuple[str, IPAddress, int]:
        """The VA's redirect policy (``processRedirect``): where to go next."""
        location = answer.location or ""

        def refuse(detail: str) -> Refused:
            return Refused(f"Fetching {location}: {detail}", "redirect")

        if seen.redirects > MAX_REDIRECTS:
            raise refuse("Too many redirects")
        seen.redirects += 1
        if answer.status not in ALLOWED_REDIRECTS:
            raise refuse("received disallowed redirect status code")
        try:
            nxt = urllib.parse.urlsplit(urllib.parse.urljoin(url, location))
            explicit_port = nxt.port
        except ValueError:
            raise refuse("invalid redirect Location") from None
        host = (nxt.hostname or "").lower()
        redirect_url = urllib.parse.urlunsplit(
            (nxt.scheme, _host_header(nxt), nxt.path, nxt.query, "")
        )
        if nxt.scheme not in ("http", "https"):
            raise refuse(
                "Invalid protocol scheme in redirect target. "
                f'Only "http" and "https" protocol schemes are supported, not {go_quote(nxt.scheme)}'
            )
        if explicit_port is not None:
            if explicit_port not in (self.port, HTTPS_PORT):
                raise refuse(
                    "Invalid port in redirect target. Only ports "
                    f"{self.port} and {HTTPS_PORT} are supported, not {explicit_port}"
                )
            port = explicit_port
        else:
            port = self.port if nxt.scheme == "http" else HTTPS_PORT
        if not host:
            raise refuse("Invalid empty host in redirect target")
        if host.endswith(".well-known"):
            raise refuse(
                f"Invalid host in redirect target {go_quote(host)}. "
                "Check webserver config for missing '/' in redirect target."
            )
        literal = ip_literal(host)
        if literal is not None:
            if "%" in host:
                raise refuse("Invalid host in redirect target: contains scope zone")
            refusal = self.addresses.refusal(literal)
            if refusal is not None:
                raise refuse(f"Invalid host in redirect target: {refusal}")
        elif _icann_suffixes().publicsuffix(host) is None:
            raise refuse("Invalid host in redirect target, must end in IANA registered TLD")
        if len(nxt.path.encode()) > MAX_PATH_SIZE:
            raise refuse("Redirect target too long")
        if redirect_url in seen.seen_urls:
            raise refuse("Redirect loop detected")
        try:
            target = await self._target(host, port)
        except Http01Unreachable as err:
            raise refuse(err.message) from None
        assert target.current is not None
        seen.seen_urls.append(redirect_url)
        seen.last_address = target.current
        return redirect_url, target.current, port
