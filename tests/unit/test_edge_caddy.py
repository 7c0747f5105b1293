"""The caddy edge's endpoint (certflow/edge/caddy.py), on an ephemeral loopback
port, asked as Caddy's ``get_certificate http`` asks: which certificate each
server name gets, who may ask, what the answer holds, and a listener it cannot
have. No Caddy here: tests/e2e/test_edge_caddy.py runs the real one."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certflow.edge.caddy import CaddyTarget
from certflow.edge.responder import bind_listener
from certflow.errors import ConfigError
from devstack.servers import free_port
from tests.unit.edge_pki import leaf

SECRET = "unit-test-secret-0123456789"


@pytest.fixture
async def target() -> AsyncIterator[CaddyTarget]:
    edge = CaddyTarget(f"127.0.0.1:{free_port()}", SECRET)
    await edge.start()
    try:
        yield edge
    finally:
        await edge.stop()


def _url(target: CaddyTarget, user: str = "certflow", secret: str = SECRET) -> str:
    return f"http://{user}:{secret}@{target.listen}/certificate"


async def _ask(target: CaddyTarget, server_name: str | None, **headers: str) -> httpx.Response:
    """GET as Caddy does (its three parameters), with the secret in the URL unless
    headers say otherwise."""
    params = {"signature_schemes": "403,804", "cipher_suites": "1301,c02b"}
    if server_name is not None:
        params["server_name"] = server_name
    url = f"http://{target.listen}/certificate" if headers else _url(target)
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.get(url, params=params, headers=headers)


async def test_exact_name_then_a_wildcard_one_label_up_else_204(target: CaddyTarget) -> None:
    """Red if the wildcard were looked up at any depth (``x.b.shop…`` got it), the
    wildcard won over an exact name, case or a trailing dot missed the name, or an
    unknown name, an IP literal or no name were answered with some certificate."""
    await target.put("a.shop.example.com", "EXACT\n", b"EXACT-KEY\n")
    await target.put("*.shop.example.com", "WILD\n", b"WILD-KEY\n")
    expected = {
        "a.shop.example.com": b"EXACT\nEXACT-KEY\n",
        "b.shop.example.com": b"WILD\nWILD-KEY\n",
        "B.Shop.EXAMPLE.com.": b"WILD\nWILD-KEY\n",
        "A.SHOP.example.com": b"EXACT\nEXACT-KEY\n",
    }
    for name, body in expected.items():
        answer = await _ask(target, name)
        assert (answer.status_code, answer.content) == (200, body), name
    unknown: tuple[str | None, ...] = (
        "x.b.shop.example.com", "shop.example.com", "unknown.example.net", "", None,
        "127.0.0.1", "::1", "[::1]", "*.shop.example.com", ".shop.example.com", "com",
    )
    for unknown_name in unknown:
        answer = await _ask(target, unknown_name)
        assert (answer.status_code, answer.content) == (204, b""), unknown_name
    assert (target.served, target.not_held, target.refused) == (4, 11, 0)

    assert await target.remove("a.shop.example.com") is True
    assert await target.remove("a.shop.example.com") is False
    assert (await _ask(target, "a.shop.example.com")).content == b"WILD\nWILD-KEY\n"
    await target.put("*.shop.example.com", "RENEWED\n", b"NEW-KEY\n")  # replaced whole
    assert (await _ask(target, "b.shop.example.com")).content == b"RENEWED\nNEW-KEY\n"
    assert await target.held() == {"*.shop.example.com"}


async def test_only_a_caller_with_the_secret_gets_a_key(target: CaddyTarget) -> None:
    """Basic (any user name, the secret as password: what Go sends for Caddy's URL)
    and Bearer get 200; none, a wrong secret, another scheme or garbage get 401,
    whose body never holds the key. Red when the check is dropped (shown: the
    ``authorized`` test in ``__call__`` removed, every refusal got 200)."""
    await target.put("shop.example.com", "CHAIN\n", b"KEY\n")
    basic = base64.b64encode(f"anyone:{SECRET}".encode()).decode()
    for headers in ({"Authorization": f"Basic {basic}"}, {"Authorization": f"Bearer {SECRET}"},
                    {"Authorization": f"bearer  {SECRET}"}):
        answer = await _ask(target, "shop.example.com", **headers)
        assert (answer.status_code, answer.content) == (200, b"CHAIN\nKEY\n"), headers
    wrong_basic = base64.b64encode(f"certflow:{SECRET}x".encode()).decode()
    refusals = (
        {"X-None": "no authorization"},
        {"Authorization": f"Bearer {SECRET[:-1]}"},
        {"Authorization": f"Basic {wrong_basic}"},
        {"Authorization": f"Basic {base64.b64encode(SECRET.encode()).decode()}"},  # no user: no colon
        {"Authorization": "Basic !!not-base64!!"},
        {"Authorization": f"Token {SECRET}"},
        {"Authorization": SECRET},
    )
    for headers in refusals:
        answer = await _ask(target, "shop.example.com", **headers)
        assert answer.status_code == 401, headers
        assert b"KEY" not in answer.content and SECRET.encode() not in answer.content
    async with httpx.AsyncClient(trust_env=False) as client:  # the secret in the URL, as Caddy has it
        ok = await client.get(_url(target), params={"server_name": "shop.example.com"})
        wrong = await client.get(_url(target, secret="not-the-secret-at-all"), params={"server_name": "shop.example.com"})
    assert (ok.status_code, wrong.status_code) == (200, 401)
    assert (target.served, target.refused) == (4, len(refusals) + 1)


async def test_the_answer_is_the_chain_leaf_first_then_its_key(target: CaddyTarget) -> None:
    """What Caddy parses: certificate blocks, leaf first, then the private key of
    that leaf. Red if the key came first or another name's pair were answered."""
    leaf_pem, key_pem = leaf("shop.example.com")
    other_pem, other_key = leaf("other.example.com")
    issuer_pem = other_pem  # stands for an intermediate: any second certificate
    await target.put("shop.example.com", leaf_pem + issuer_pem, key_pem)
    await target.put("other.example.com", other_pem, other_key)
    body = (await _ask(target, "shop.example.com")).content
    certificates_part, marker, key_part = body.partition(key_pem.splitlines(keepends=True)[0])
    assert marker and b"CERTIFICATE" not in key_part
    chain = x509.load_pem_x509_certificates(certificates_part)
    assert [c.subject for c in chain] == [
        x509.load_pem_x509_certificate(leaf_pem.encode()).subject,
        x509.load_pem_x509_certificate(issuer_pem.encode()).subject,
    ]
    key = serialization.load_pem_private_key(marker + key_part, password=None)
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(*spki) == chain[0].public_key().public_bytes(*spki)


async def test_a_listener_it_cannot_have_is_one_config_error_naming_the_setting() -> None:
    """A port in use and an address that is not this host's: ConfigError, one line
    naming CERTFLOW_EDGE_LISTEN. Red if the OSError escaped (a traceback at start)
    or the bind were deferred to the server task (the edge would run deaf)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as raised:
            await CaddyTarget(f"127.0.0.1:{port}", SECRET).start()
        assert str(raised.value).startswith(f"CERTFLOW_EDGE_LISTEN: cannot listen on 127.0.0.1:{port}:")
        assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match="^CERTFLOW_EDGE_LISTEN: cannot listen on 192.0.2.1:8404"):
        await CaddyTarget("192.0.2.1:8404", SECRET).start()  # TEST-NET-1: not an address of this host


async def test_stopped_it_no_longer_answers() -> None:
    """stop() shuts the listener: red if the server task were left running."""
    edge = CaddyTarget(f"127.0.0.1:{free_port()}", SECRET)
    await edge.start()
    assert (await _ask(edge, "x.example.com")).status_code == 204
    await edge.stop()
    with pytest.raises(httpx.ConnectError):
        await _ask(edge, "x.example.com")


async def test_an_endpoint_that_stopped_serving_is_started_again_at_the_next_poll(target: CaddyTarget) -> None:
    """The server task ended under it (uvicorn exiting): restarted(), which the
    follower calls every poll, serves again from the same memory and says nothing
    was lost. Red if the check were dropped (shown: ``restarted`` returning False
    at once, the endpoint stayed down: ConnectError)."""
    await target.put("shop.example.com", "CHAIN\n", b"KEY\n")
    server = target._server
    assert server is not None
    server.should_exit = True  # as if uvicorn had stopped on its own
    while not (target._task is not None and target._task.done()):
        await asyncio.sleep(0.01)
    with pytest.raises(httpx.ConnectError):
        await _ask(target, "shop.example.com")
    assert await target.restarted() is False
    assert (await _ask(target, "shop.example.com")).content == b"CHAIN\nKEY\n"
    assert await target.restarted() is False  # serving: nothing to do


def test_the_listener_turns_nagle_off() -> None:
    """Caddy keeps its connection to the endpoint alive, and an answer goes out in
    two writes (headers, body): with Nagle on, each request after a connection's
    first waited out the client's delayed ACK, 44 ms, capping Caddy at ~40
    handshakes a second (``bench --edges`` found it: 42 against 740 with a static
    certificate). asyncio turns Nagle off only on sockets made with IPPROTO_TCP.
    Red with ``socket.socket(family, SOCK_STREAM)`` as before (proto 0)."""
    sock = bind_listener("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
