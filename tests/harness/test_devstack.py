"""The dev servers come up for real and answer like the suites expect.

Nothing here is skipped: a missing binary makes the start-up raise StackError,
whose message says how to install it.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest
from cryptography import x509
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    RegisterNamespaceRequest,
)
from temporalio.client import Client

from devstack import servers
from devstack.servers import PebbleStack, StackError

pytestmark = pytest.mark.e2e  # real binaries: out of the fast tier


@pytest.fixture(scope="module")
def pebble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PebbleStack]:
    stack = servers.start_pebble(tmp_path_factory.mktemp("pebble"))
    yield stack
    stack.stop()


def _query(stack: PebbleStack, name: str, rdtype: str) -> dns.message.Message:
    host, port = stack.dns_resolver.rsplit(":", 1)
    query = dns.message.make_query(name, rdtype)
    return dns.query.udp(query, host, port=int(port), timeout=2)


def _records(stack: PebbleStack, name: str, rdtype: str) -> list[str]:
    wanted = dns.rdatatype.from_text(rdtype)
    response = _query(stack, name, rdtype)
    return [rd.to_text() for rrset in response.answer if rrset.rdtype == wanted for rd in rrset]


def test_free_port_is_bindable() -> None:
    port = servers.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_directory_offers_new_order(pebble: PebbleStack) -> None:
    context = ssl.create_default_context(cafile=str(pebble.ca_bundle))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    with opener.open(pebble.directory_url, timeout=5) as resp:
        directory = json.load(resp)
    assert directory["newOrder"].startswith(pebble.directory_url.removesuffix("/dir"))


def test_root_pem_is_a_ca_certificate(pebble: PebbleStack) -> None:
    root = x509.load_pem_x509_certificate(pebble.root_pem().encode())
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_cname_set_and_clear(pebble: PebbleStack) -> None:
    pebble.set_cname("shop.customer.test", "edge.certflow.test")
    assert _records(pebble, "shop.customer.test", "CNAME") == ["edge.certflow.test."]

    pebble.clear_cname("shop.customer.test")
    assert _records(pebble, "shop.customer.test", "CNAME") == []


def test_caa_records_are_served(pebble: PebbleStack) -> None:
    policies = [("issue", "letsencrypt.org"), ("iodef", "mailto:x@y.test")]
    pebble.add_caa("caa.customer.test", policies)
    assert sorted(_records(pebble, "caa.customer.test", "CAA")) == [
        '0 iodef "mailto:x@y.test"',
        '0 issue "letsencrypt.org"',
    ]

    pebble.clear_caa("caa.customer.test")
    assert _records(pebble, "caa.customer.test", "CAA") == []


def test_servfail_and_a_records(pebble: PebbleStack) -> None:
    pebble.set_servfail("broken.customer.test")
    assert _query(pebble, "broken.customer.test", "A").rcode() == dns.rcode.SERVFAIL
    pebble.clear_servfail("broken.customer.test")
    assert _records(pebble, "broken.customer.test", "A") == ["127.0.0.1"]

    pebble.add_a("elsewhere.customer.test", ["192.0.2.7"])
    assert _records(pebble, "elsewhere.customer.test", "A") == ["192.0.2.7"]
    pebble.clear_a("elsewhere.customer.test")
    assert _records(pebble, "elsewhere.customer.test", "A") == ["127.0.0.1"]
    # IPv6 default is off so Pebble's VA only ever dials 127.0.0.1.
    assert _records(pebble, "elsewhere.customer.test", "AAAA") == []


def test_unknown_serial_raises_key_error(pebble: PebbleStack) -> None:
    with pytest.raises(KeyError):
        pebble.cert_status_by_serial("0a:bc:de")


def test_missing_binary_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="apt-get install pebble"):
        servers.start_pebble(tmp_path)


async def test_temporal_dev_server_keeps_state_across_restart(tmp_path: Path) -> None:
    server = servers.start_temporal(tmp_path, search_attributes={"CertflowHostname": "Keyword"})
    try:
        client = await Client.connect(server.address)
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(
                namespace="devstack-test",
                workflow_execution_retention_period=Duration(seconds=86400),
            )
        )

        server.restart()

        client = await Client.connect(server.address)
        described = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace="devstack-test")
        )
        assert described.namespace_info.name == "devstack-test"
    finally:
        server.stop()


async def test_embedded_postgres_and_create_database(tmp_path: Path) -> None:
    server = servers.start_embedded_postgres(tmp_path)
    try:
        conn = await asyncpg.connect(server.url)
        try:
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()

        # Called from inside a running loop on purpose: that is how async tests use it.
        url = servers.create_database(server.url, "devstack_test")
        url = servers.create_database(server.url, "devstack_test")  # drop + recreate works
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT current_database()") == "devstack_test"
            await conn.execute("CREATE TABLE t (x int)")
        finally:
            await conn.close()
    finally:
        server.stop()
