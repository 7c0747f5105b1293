"""The HTTP-01 self-check fetches as Boulder's VA fetches (va/http.go, va/dns.go).

Real sockets on loopback (servers on 127.0.0.x and ::1, ports where nothing
listens), the address lookups a stub: which A/AAAA answers or failures each case
needs. The expected verdicts and texts are Boulder's, worked out by hand from
its source, never from the fetcher's own helpers.

Shown red on the fetcher before this change (every address had to answer; a
failed AAAA lookup failed the check; 303 followed; any host and any reserved
address followed; 64 KiB read; ``rstrip`` of bytes): the fallback, AAAA-SERVFAIL,
303, reserved-redirect, non-IANA-TLD, 128-byte and 11-redirect cases.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from certflow.dns.lookup import DnsLookupError
from certflow.dns.http01_fetch import Http01Fetcher, Http01Unreachable, trimmed_payload
from certflow.dns.reserved import AddressPolicy, reserved_reason

TOKEN = "tok-en_123"
KEY_AUTH = f"{TOKEN}.thumbprint-ABC"
PATH = f"/.well-known/acme-challenge/{TOKEN}"
LOOPBACK = AddressPolicy.allowing(["127.0.0.0/8", "::1/128"])

Handler = Callable[[str, str], tuple[int, dict[str, str], bytes]]
"""(host header, path) → (status, headers, body)."""


@dataclass
class StubDns:
    """A/AAAA answers per name: a list of addresses, or the DnsLookupError to raise."""

    answers: dict[tuple[str, str], list[str] | DnsLookupError] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def set(self, name: str, a: list[str] | str, aaaa: list[str] | str = "NOERROR") -> None:
        for rdtype, value in (("A", a), ("AAAA", aaaa)):
            if isinstance(value, str):
                self.answers[(name, rdtype)] = (
                    [] if value == "NOERROR" else DnsLookupError(
                        name, rdtype, value,
                        f"DNS problem: {value} looking up {rdtype} for {name}"
                        + (" - the domain's nameservers may be malfunctioning" if value == "SERVFAIL" else ""),
                    )
                )
            else:
                self.answers[(name, rdtype)] = value

    async def lookup_addresses(self, name: str, rdtype: str) -> list[str]:
        self.asked.append((name, rdtype))
        found = self.answers.get((name, rdtype), [])
        if isinstance(found, DnsLookupError):
            raise found
        return list(found)


class _Server:
    """One HTTP server on (address, port) that records the requests it got."""

    def __init__(self, address: str, port: int, handler: Handler) -> None:
        requests = self.requests = []  # type: list[tuple[str, str]]

        class Handle(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                host = self.headers.get("Host", "")
                requests.append((host, self.path))
                status, headers, body = handler(host, self.path)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        family = socket.AF_INET6 if ":" in address else socket.AF_INET

        class Server(http.server.ThreadingHTTPServer):
            address_family = family

        self._httpd = Server((address, port), Handle)
        # A short poll: shutdown waits for the loop to notice (0.5 s per test at the default).
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def port() -> int:
    return _free_port()


@pytest.fixture
def servers() -> Iterator[Callable[[str, int, Handler], _Server]]:
    started: list[_Server] = []

    def start(address: str, port: int, handler: Handler) -> _Server:
        server = _Server(address, port, handler)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def answers(body: bytes = KEY_AUTH.encode()) -> Handler:
    return lambda host, path: (200, {}, body) if path == PATH else (404, {}, b"")


def redirects_to(location: str, status: int = 302) -> Handler:
    return lambda host, path: (status, {"Location": location}, b"")


def fetcher(dns: StubDns, port: int, policy: AddressPolicy = LOOPBACK) -> Http01Fetcher:
    return Http01Fetcher(dns, port=port, addresses=policy, deadline_seconds=10)  # type: ignore[arg-type]


async def refused(dns: StubDns, port: int, host: str = "shop.example.com", **kw: Any) -> Http01Unreachable:
    with pytest.raises(Http01Unreachable) as caught:
        await fetcher(dns, port, **kw).check(host, TOKEN, KEY_AUTH)
    return caught.value


# ------------------------------------------------------------------ addresses


async def test_aaaa_refusing_falls_back_to_the_first_a(port: int, servers: Any) -> None:
    """Nothing listens on [::1]:port (a dial error): the VA tries the first A."""
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.21", "127.0.0.22"], ["::1"])
    first = servers("127.0.0.21", port, answers())
    second = servers("127.0.0.22", port, answers(b"wrong"))
    found = await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)
    assert "::1 did not connect" in found and "Connection refused" in found
    assert f"from 127.0.0.21:{port}" in found
    assert first.requests == [("shop.example.com", PATH)]
    assert second.requests == []  # only the first A: never every address


async def test_only_the_first_aaaa_is_tried(port: int, servers: Any) -> None:
    """A working AAAA answers: the A records are never fetched, however broken."""
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.23"], ["::1"])
    v6 = servers("::1", port, answers())
    found = await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)
    assert f"from [::1]:{port}" in found
    assert v6.requests == [("shop.example.com", PATH)]


async def test_a_read_error_on_the_aaaa_does_not_fall_back(port: int, servers: Any) -> None:
    """A connection accepted, then closed without an answer, is not a dial error:
    the VA reports it and never tries the A."""
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.24"], ["::1"])
    a = servers("127.0.0.24", port, answers())
    with socket.socket(socket.AF_INET6) as silent:
        silent.bind(("::1", port))
        silent.listen()
        def read_then_close() -> None:
            conn, _ = silent.accept()
            conn.recv(65536)  # the whole request, so the close is a clean EOF
            conn.close()

        closer = threading.Thread(target=read_then_close, daemon=True)
        closer.start()
        err = await refused(dns, port)
    assert err.message == f"::1: Fetching http://shop.example.com{PATH}: Error getting validation data"
    assert a.requests == []


@pytest.mark.parametrize("aaaa", ["SERVFAIL", "NOERROR"])
async def test_one_family_failing_is_fine(port: int, servers: Any, aaaa: str) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.25"], aaaa)
    servers("127.0.0.25", port, answers())
    assert "127.0.0.25" in await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)


async def test_both_families_failing_is_the_cas_dns_problem(port: int) -> None:
    dns = StubDns()
    dns.set("shop.example.com", "SERVFAIL", "NOERROR")
    err = await refused(dns, port)
    assert err.reason == "dns"
    assert err.message == (
        "DNS problem: SERVFAIL looking up A for shop.example.com - the domain's nameservers"
        " may be malfunctioning; no valid AAAA records found for shop.example.com"
    )


async def test_reserved_addresses_are_dropped(port: int, servers: Any) -> None:
    """10.0.0.0/8 and fc00::/7 are reserved: the VA never connects there (here the
    loopback networks are allowed, as a test rig's CA allows them)."""
    dns = StubDns()
    dns.set("shop.example.com", ["10.1.2.3"], ["fd00::5"])
    err = await refused(dns, port)
    assert err.message == (
        "no valid A records found for shop.example.com;"
        " no valid AAAA records found for shop.example.com"
    )
    dns.set("shop.example.com", ["10.1.2.3", "127.0.0.26"], ["fd00::5"])
    servers("127.0.0.26", port, answers())
    assert "127.0.0.26" in await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)


def test_the_registry_names_the_block() -> None:
    import ipaddress

    assert reserved_reason(ipaddress.ip_address("192.168.1.1")) == (
        "IP address is in a reserved address block: [RFC1918]: Private-Use"
    )
    assert reserved_reason(ipaddress.ip_address("192.0.0.9")) == (
        "IP address is in a reserved address block: [RFC7723]: Port Control Protocol Anycast"
    )  # the /32, not the /24 around it
    assert reserved_reason(ipaddress.ip_address("::ffff:127.0.0.1")) is not None
    assert reserved_reason(ipaddress.ip_address("8.8.8.8")) is None
    assert reserved_reason(ipaddress.ip_address("224.0.0.1")) is None  # multicast: in neither registry
    assert reserved_reason(ipaddress.ip_address("2606:4700::1")) is None


# ------------------------------------------------------------------ redirects


async def test_303_is_refused(port: int, servers: Any) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.27"])
    servers("127.0.0.27", port, redirects_to(f"http://127.0.0.28:{port}/x", status=303))
    err = await refused(dns, port)
    assert err.reason == "redirect"
    assert err.message == (
        f"127.0.0.27: Fetching http://127.0.0.28:{port}/x: received disallowed redirect status code"
    )


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_the_four_redirects_are_followed(port: int, servers: Any, status: int) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.29"])
    servers("127.0.0.29", port, redirects_to(f"http://127.0.0.30:{port}{PATH}", status=status))
    target = servers("127.0.0.30", port, answers())
    await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)
    assert target.requests == [(f"127.0.0.30:{port}", PATH)]


async def test_a_redirect_to_a_reserved_address_is_refused(port: int, servers: Any) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.31"])
    servers("127.0.0.31", port, redirects_to("http://169.254.169.254/latest/meta-data"))
    err = await refused(dns, port)
    assert err.message == (
        "127.0.0.31: Fetching http://169.254.169.254/latest/meta-data: Invalid host in redirect"
        " target: IP address is in a reserved address block: [RFC3927]: Link Local"
    )


@pytest.mark.parametrize(
    ("location", "detail"),
    [
        ("http://edge.saas.test/x", "Invalid host in redirect target, must end in IANA registered TLD"),
        ("ftp://shop.example.com/x", 'Invalid protocol scheme in redirect target. Only "http" and'
         ' "https" protocol schemes are supported, not "ftp"'),
        ("http://shop.example.com:8080/x", "Invalid port in redirect target. Only ports {port} and"
         " 443 are supported, not 8080"),
        ("https://shop.example.com.well-known/acme-challenge/x", 'Invalid host in redirect target'
         ' "shop.example.com.well-known". Check webserver config for missing \'/\' in redirect target.'),
        ("http://shop.example.com/" + "a" * 2000, "Redirect target too long"),
    ],
)
async def test_redirect_targets_the_ca_refuses(
    port: int, servers: Any, location: str, detail: str
) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.32"])
    servers("127.0.0.32", port, redirects_to(location))
    err = await refused(dns, port)
    assert err.message == f"127.0.0.32: Fetching {location}: {detail.format(port=port)}"


async def test_eleven_redirects_are_followed_the_twelfth_refused(port: int, servers: Any) -> None:
    """Boulder checks ``numRedirects > maxRedirect`` before counting: 11 pass."""

    def chain(length: int) -> Handler:
        def handle(host: str, path: str) -> tuple[int, dict[str, str], bytes]:
            hop = int(path.rsplit("/", 1)[-1]) if path.startswith("/hop/") else 0
            if hop < length:
                return 302, {"Location": f"/hop/{hop + 1}"}, b""
            return 200, {}, KEY_AUTH.encode()

        return handle

    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.33"])
    server = servers("127.0.0.33", port, chain(11))
    await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)
    assert len(server.requests) == 12
    server.stop()
    servers("127.0.0.33", port, chain(12))
    err = await refused(dns, port)
    assert err.message == "127.0.0.33: Fetching /hop/12: Too many redirects"


async def test_a_redirect_loop_is_refused(port: int, servers: Any) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.34"])
    servers("127.0.0.34", port, lambda host, path: (
        (302, {"Location": "/b"}, b"") if path != "/b" else (302, {"Location": PATH}, b"")
    ))
    err = await refused(dns, port)
    assert err.message == f"127.0.0.34: Fetching {PATH}: Redirect loop detected"


async def test_a_dial_error_after_a_redirect_restarts_from_the_first_url(
    port: int, servers: Any
) -> None:
    """Boulder's quirk, kept: a dial error at a redirect's target falls back to the
    *first* URL's A and re-runs the whole fetch with the URLs seen so far, so the
    redirect it meets again is a loop."""
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.35"], ["::1"])
    dns.set("other.example.com", ["127.0.0.36"])  # nothing listens there
    servers("::1", port, redirects_to(f"http://other.example.com{PATH}"))
    v4 = servers("127.0.0.35", port, redirects_to(f"http://other.example.com{PATH}"))
    err = await refused(dns, port)
    assert v4.requests == [("shop.example.com", PATH)]  # the fallback did run
    assert err.message == (
        f"127.0.0.35: Fetching http://other.example.com{PATH}: Redirect loop detected"
    )


# ------------------------------------------------------------------ the answer


async def test_the_body_is_read_to_128_bytes(port: int, servers: Any) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.37"])
    server = servers("127.0.0.37", port, answers((KEY_AUTH + " " * (127 - len(KEY_AUTH))).encode()))
    await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)  # 127 bytes: fine
    server.stop()
    servers("127.0.0.37", port, answers((KEY_AUTH + " " * (128 - len(KEY_AUTH))).encode()))
    err = await refused(dns, port)
    assert err.reason == "body_too_large"
    assert err.message.startswith(f"127.0.0.37: Invalid response from http://shop.example.com{PATH}: ")


def test_trailing_space_as_go_trims_it() -> None:
    assert trimmed_payload(b"abc \t\r\n\v\f") == b"abc"
    assert trimmed_payload("abc\u00a0\u3000".encode()) == b"abc"
    # Python's str.rstrip() would take these; Go's unicode.IsSpace does not.
    assert trimmed_payload(b"abc\x1c\x1f") == b"abc\x1c\x1f"
    assert trimmed_payload(b"abc\xff ") == b"abc\xff"


async def test_a_wrong_body_says_what_the_ca_says(port: int, servers: Any) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.38"])
    servers("127.0.0.38", port, answers(b"nope\n"))
    err = await refused(dns, port)
    assert err.reason == "wrong_body"
    assert err.message == (
        "The key authorization file from the server did not match this challenge."
        f' Expected "{KEY_AUTH}" (got "nope")'
    )


async def test_a_404_is_an_invalid_response(port: int, servers: Any) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.39"])
    servers("127.0.0.39", port, lambda host, path: (404, {}, b""))
    err = await refused(dns, port)
    assert (err.reason, err.message) == (
        "status", f"127.0.0.39: Invalid response from http://shop.example.com{PATH}: 404"
    )


async def test_the_host_header_is_the_hostname(port: int, servers: Any) -> None:
    """Go's client sends the URL's host; the CA's own port is not in the first URL."""
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.40"])
    server = servers("127.0.0.40", port, answers())
    await fetcher(dns, port).check("shop.example.com", TOKEN, KEY_AUTH)
    assert server.requests == [("shop.example.com", PATH)]


async def test_loopback_is_refused_without_the_rig_setting(port: int, servers: Any) -> None:
    dns = StubDns()
    dns.set("shop.example.com", ["127.0.0.41"])
    servers("127.0.0.41", port, answers())
    err = await refused(dns, port, policy=AddressPolicy())
    assert err.reason == "dns" and "no valid A records" in err.message
