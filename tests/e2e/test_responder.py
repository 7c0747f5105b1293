"""The HTTP-01 responder against real Postgres, in-process (ASGI) and over a socket."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import asyncpg
import httpx
import pytest

from certflow.store import certificates
from certflow.store.db import create_pool, migrate
from devstack.servers import free_port
from certflow.activity_payloads import OpenedOrder
from certflow.edge.responder import ChallengeResponder, bind_listener, responder_server
from certflow.hostnames import as_hostname

TOKEN = "tok_" + "A" * 39
KEY_AUTH = TOKEN + ".thumbprint"
HOST = as_hostname("shop.responder.test")


@pytest.fixture(scope="module")
async def pool(new_database: Callable[[], str]) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(new_database(), max_size=4)
    await migrate(p)
    record = await certificates.ensure_certificate(p, HOST, None, None)
    order = OpenedOrder(
        order_url="https://ca.test/order/1",
        authorization_url="https://ca.test/authz/1",
        challenge_url="https://ca.test/chall/1",
        token=TOKEN,
        key_authorization=KEY_AUTH,
    )
    assert await certificates.persist_challenge(p, record.certificate_id, order)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def http(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=ChallengeResponder(pool))
    async with httpx.AsyncClient(transport=transport, base_url=f"http://{HOST}") as client:
        yield client


async def test_serves_the_key_authorization_for_the_right_host(http: httpx.AsyncClient) -> None:
    for host in (HOST, HOST.upper() + ":80", HOST + "."):
        response = await http.get(f"/.well-known/acme-challenge/{TOKEN}", headers={"Host": host})
        assert response.status_code == 200, host
        assert response.text == KEY_AUTH
        assert response.headers["content-type"] == "text/plain"


@pytest.mark.parametrize(
    ("method", "path", "host", "status"),
    [
        ("GET", f"/.well-known/acme-challenge/{TOKEN}", "other.responder.test", 404),
        ("GET", f"/.well-known/acme-challenge/{TOKEN}", "[::1]:80", 404),
        ("GET", "/.well-known/acme-challenge/" + "B" * 43, HOST, 404),
        ("GET", "/.well-known/acme-challenge/../../etc/passwd", HOST, 404),
        ("GET", "/.well-known/acme-challenge/" + "%2e%2e%2fetc", HOST, 404),
        ("GET", "/.well-known/acme-challenge/" + "A" * 5000, HOST, 404),
        ("GET", "/.well-known/acme-challenge/short", HOST, 404),
        ("GET", "/", HOST, 404),
        ("POST", f"/.well-known/acme-challenge/{TOKEN}", HOST, 405),
        ("DELETE", f"/.well-known/acme-challenge/{TOKEN}", HOST, 405),
    ],
)
async def test_everything_else_is_404_or_405(
    http: httpx.AsyncClient, method: str, path: str, host: str, status: int
) -> None:
    response = await http.request(method, path, headers={"Host": host})
    assert response.status_code == status
    assert KEY_AUTH not in response.text


async def test_closed_challenge_is_no_longer_served(pool: asyncpg.Pool) -> None:
    host = as_hostname(f"closed-{uuid.uuid4().hex[:6]}.responder.test")
    token = "closed_" + uuid.uuid4().hex
    record = await certificates.ensure_certificate(pool, host, None, None)
    order = OpenedOrder(
        order_url=f"https://ca.test/order/{token}",
        authorization_url="https://ca.test/a",
        challenge_url="https://ca.test/c",
        token=token,
        key_authorization=token + ".x",
    )
    await certificates.persist_challenge(pool, record.certificate_id, order)
    app = ChallengeResponder(pool, cache_seconds=0)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as http:
        assert (await http.get(f"/.well-known/acme-challenge/{token}")).status_code == 200
        await pool.execute(
            "UPDATE certificates SET http_challenge_token = NULL WHERE hostname = $1", host
        )
        assert (await http.get(f"/.well-known/acme-challenge/{token}")).status_code == 404


async def test_standalone_server_on_a_socket(pool: asyncpg.Pool) -> None:
    port = free_port()
    server = responder_server(ChallengeResponder(pool), "127.0.0.1", port)
    task = asyncio.create_task(server.serve(sockets=[bind_listener("127.0.0.1", port)]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient() as http:
            response = await http.get(
                f"http://127.0.0.1:{port}/.well-known/acme-challenge/{TOKEN}",
                headers={"Host": f"{HOST}:{port}"},
            )
        assert response.status_code == 200 and response.text == KEY_AUTH
        with pytest.raises(OSError):
            bind_listener("127.0.0.1", port)  # a taken port is a clear start-up error
    finally:
        server.should_exit = True
        await task
