"""The TLS rig (devstack/temporal_tls.py) in front of the real Temporal dev server.

HAProxy terminates TLS for the session's dev server two ways: mTLS (a client
certificate from the client CA) and an API key over TLS. These tests prove the
rig with the Python SDK and the ``temporal`` CLI directly, before any product
code relies on it: what must connect connects, what must be refused is refused
quickly, with the exception and text pinned here (the product maps them to its
one-line messages, so a change in what the SDK raises shows up here first).

Everything is read-only on the ``default`` namespace: no workflow is started.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    CountWorkflowExecutionsRequest,
    GetSystemInfoRequest,
    PollWorkflowTaskQueueRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from devstack import servers
from devstack.temporal_tls import (
    REJECT_MESSAGE,
    SERVER_NAME,
    TemporalPki,
    TlsProxy,
    start_tls_proxy,
    write_temporal_pki,
)

pytestmark = pytest.mark.e2e

_BOUND_S = 10.0
"""A refusal must raise within this; ``wait_for`` gives up at 15 s (a hang)."""


@dataclass(frozen=True)
class Rig:
    temporal: servers.TemporalDevServer
    pki: TemporalPki
    mtls: TlsProxy
    api_key: TlsProxy
    """Refuses a wrong key with HTTP 401 (``reject="http_401"``)."""
    grpc_api_key: TlsProxy
    """Refuses a wrong key with gRPC UNAUTHENTICATED (``reject="grpc_unauthenticated"``)."""

    def tls(self, *, domain: str = SERVER_NAME, client: str | None = None) -> TLSConfig:
        """Trust the rig's server CA; present the ``client`` ("client"/"other") leaf."""
        cert = key = None
        if client == "client":
            cert, key = self.pki.client_cert.read_bytes(), self.pki.client_key.read_bytes()
        elif client == "other":
            cert = self.pki.other_client_cert.read_bytes()
            key = self.pki.other_client_key.read_bytes()
        return TLSConfig(
            server_root_ca_cert=self.pki.server_ca.read_bytes(),
            domain=domain,
            client_cert=cert,
            client_private_key=key,
        )

    @property
    def key(self) -> str:
        assert self.api_key.api_key is not None
        return self.api_key.api_key


@pytest.fixture(scope="module")
def rig(
    temporal: servers.TemporalDevServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    workdir = tmp_path_factory.mktemp("temporal-tls")
    backend = int(temporal.address.rsplit(":", 1)[1])
    pki = write_temporal_pki(workdir / "pki")
    proxies: list[TlsProxy] = []
    try:
        proxies.append(start_tls_proxy(workdir / "mtls", backend, mode="mtls", pki=pki))
        proxies.append(start_tls_proxy(workdir / "api-key", backend, mode="api_key", pki=pki))
        proxies.append(
            start_tls_proxy(
                workdir / "grpc-api-key",
                backend,
                mode="api_key",
                pki=pki,
                api_key=proxies[1].api_key,
                reject="grpc_unauthenticated",
            )
        )
        yield Rig(temporal, pki, *proxies)
    finally:
        for proxy in proxies:
            proxy.stop()


async def _connect(address: str, **kwargs: Any) -> Client:
    client = await asyncio.wait_for(Client.connect(address, namespace="default", **kwargs), 15)
    # connect already asked get_system_info; ask again, and count, on the same client.
    await asyncio.wait_for(client.workflow_service.get_system_info(GetSystemInfoRequest()), 15)
    await asyncio.wait_for(
        client.workflow_service.count_workflow_executions(
            CountWorkflowExecutionsRequest(namespace="default")
        ),
        15,
    )
    return client


async def _refusal(address: str, **kwargs: Any) -> tuple[BaseException, float]:
    """The exception connecting raises and how long it took (fails if it connects)."""
    started = time.monotonic()
    try:
        await _connect(address, **kwargs)
    except Exception as exc:  # asyncio.TimeoutError included: asserted on below
        elapsed = time.monotonic() - started
        print(f"{address}: {type(exc).__qualname__} after {elapsed:.3f} s: {exc}")
        return exc, elapsed
    pytest.fail(f"connected to {address}, which should have refused {kwargs}")


@dataclass(frozen=True)
class Expect:
    """What the RuntimeError's text holds: every one of ``all_of``, and (when
    given) at least one of ``one_of``."""

    all_of: tuple[str, ...]
    one_of: tuple[str, ...] = ()


AFTER_HANDSHAKE = "Failed client connect: `get_system_info` call error after connection: "
"""A refusal after the client finished its side of the handshake (or a plaintext
client at a TLS port): the first call fails."""

CLOSED_UNDER_THE_CALL = (
    'Status { code: Cancelled, message: "operation was canceled", source: Some('
    'tonic::transport::Error(Transport, hyper::Error(Canceled, "connection closed"))) }',
    # The same, met before hyper had the connection ready (once in CI, loaded).
    'Status { code: Cancelled, message: "operation was canceled", source: Some('
    'tonic::transport::Error(Transport, hyper::Error(Canceled, "connection was not ready"))) }',
    # Then "stream closed because of a broken pipe" or "connection closed because of
    # a broken pipe", depending on where hyper meets it.
    'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::'
    'Error(Transport, hyper::Error(Io, Custom { kind: BrokenPipe, error: "',
    'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::'
    "Error(Transport, hyper::Error(Io, Kind(ConnectionReset)))) }",
)
"""How the first call fails when the server drops the connection under it. With
TLS 1.3 the client sends its certificate and then at once its first request, so
whether it reads the server's alert first (and names it) or meets the closed
connection is a race. Measured here, 200 tries each: no client certificate named
CertificateRequired 73 times (Cancelled 58, BrokenPipe 69); another CA's
certificate named UnknownCA 174 times (BrokenPipe 22, Cancelled 4); plaintext at
a TLS port gave ConnectionReset, BrokenPipe or Cancelled. The product cannot
count on the alert."""


def _alert(name: str) -> str:
    return (
        'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::'
        f'Error(Transport, hyper::Error(Io, Custom {{ kind: InvalidData, error: "received '
        f'fatal alert: {name}" }}))) }}'
    )


def _assert_refused(error: BaseException, elapsed: float, expect: Expect) -> None:
    assert not isinstance(error, asyncio.TimeoutError), "hung instead of failing"
    assert elapsed < _BOUND_S, f"took {elapsed:.1f} s to fail"
    assert type(error) is RuntimeError, repr(error)
    text = str(error)
    assert text.startswith("Failed client connect: "), text
    for fragment in expect.all_of:
        assert fragment in text, text
    if expect.one_of:
        assert any(fragment in text for fragment in expect.one_of), text


# ---------------------------------------------------------------------------- PKI


def test_pki_is_x509_v3_with_the_extensions_rustls_wants(tmp_path: Path) -> None:
    """Every certificate is v3 with basicConstraints, keyUsage and the right EKU; the
    server leaf names temporal.certflow.test, localhost and 127.0.0.1; keys are
    PKCS#8 and 0600; HAProxy's crt is the leaf then its key. Red if a certificate
    came out v1 (rustls: UnsupportedCertVersion) or a key readable by others."""
    pki = write_temporal_pki(tmp_path)

    def load(path: Path) -> x509.Certificate:
        return x509.load_pem_x509_certificate(path.read_bytes())

    for ca_path in (pki.server_ca, pki.client_ca, pki.other_ca):
        ca = load(ca_path)
        assert ca.version is x509.Version.v3
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaves = {
        pki.server_cert: (pki.server_ca, ExtendedKeyUsageOID.SERVER_AUTH),
        pki.client_cert: (pki.client_ca, ExtendedKeyUsageOID.CLIENT_AUTH),
        pki.other_client_cert: (pki.other_ca, ExtendedKeyUsageOID.CLIENT_AUTH),
    }
    for leaf_path, (ca_path, eku) in leaves.items():
        leaf, ca = load(leaf_path), load(ca_path)
        assert leaf.version is x509.Version.v3
        leaf.verify_directly_issued_by(ca)
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [eku]
    san = load(pki.server_cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.DNSName) == [SERVER_NAME, "localhost"]
    assert [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert load(pki.other_client_cert).issuer != load(pki.client_cert).issuer

    for key_path in (pki.server_key, pki.client_key, pki.other_client_key, pki.server_pem):
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600, key_path
        written = key_path.read_bytes()
        key = serialization.load_pem_private_key(written[written.index(b"-----BEGIN", 1 if key_path == pki.server_pem else 0):], password=None)
        pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        assert written.endswith(pkcs8)  # PKCS#8, as written
    combined = pki.server_pem.read_bytes()
    assert combined == pki.server_cert.read_bytes() + pki.server_key.read_bytes()
    serialization.load_pem_private_key(pki.server_key.read_bytes(), password=None)


# --------------------------------------------------------------------------- mTLS


async def test_mtls_right_client_certificate_connects(rig: Rig) -> None:
    """The client leaf of the client CA, the server CA and the server name get
    through HAProxy's ``verify required`` to the dev server. Red if the proxy's
    bind, the PKI or the tcp backend is wrong (then every mTLS test downstream
    would fail for the rig's sake, not the product's)."""
    client = await _connect(rig.mtls.address, tls=rig.tls(client="client"))
    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version


MTLS_REFUSALS: dict[str, tuple[Callable[[Rig], dict[str, Any]], Expect]] = {
    # The handshake finishes on the client's side (TLS 1.3), so the refusal comes
    # on the first call: the server's alert, or the closed connection (a race).
    "no client certificate": (
        lambda rig: {"tls": rig.tls()},
        Expect((AFTER_HANDSHAKE,), (_alert("CertificateRequired"), *CLOSED_UNDER_THE_CALL)),
    ),
    "client certificate from another CA": (
        lambda rig: {"tls": rig.tls(client="other")},
        Expect((AFTER_HANDSHAKE,), (_alert("UnknownCA"), *CLOSED_UNDER_THE_CALL)),
    ),
    # The client's own checks of the server fail inside the handshake: deterministic.
    "wrong domain": (
        lambda rig: {"tls": rig.tls(domain="wrong.certflow.test", client="client")},
        Expect(
            (
                "Failed client connect: Server connection error: tonic::transport::Error("
                "Transport, ConnectError(Custom { kind: InvalidData, error: InvalidCertificate("
                'NotValidForNameContext { expected: DnsName("wrong.certflow.test"), presented: '
                '["DnsName(\\"temporal.certflow.test\\")", "DnsName(\\"localhost\\")", '
                '"IpAddress(127.0.0.1)"] }) }))',
            )
        ),
    ),
    "server CA not trusted": (
        lambda rig: {
            "tls": TLSConfig(
                server_root_ca_cert=rig.pki.other_ca.read_bytes(),
                domain=SERVER_NAME,
                client_cert=rig.pki.client_cert.read_bytes(),
                client_private_key=rig.pki.client_key.read_bytes(),
            )
        },
        Expect(
            (
                "Failed client connect: Server connection error: tonic::transport::Error("
                "Transport, ConnectError(Custom { kind: InvalidData, error: InvalidCertificate("
                "UnknownIssuer) }))",
            )
        ),
    ),
    "plaintext to the TLS port": (
        lambda rig: {},
        Expect((AFTER_HANDSHAKE,), CLOSED_UNDER_THE_CALL),
    ),
}


@pytest.mark.parametrize("case", list(MTLS_REFUSALS))
async def test_mtls_refusals_are_quick_and_say_why(rig: Rig, case: str) -> None:
    """Each wrong mTLS setup fails within 10 s with one of the RuntimeErrors pinned
    here (a refused client certificate names its alert only when it wins a race,
    see CLOSED_UNDER_THE_CALL). Red if the proxy let it through (``verify
    required`` lost), if it hung, or if the SDK now raises something else (then
    the product's mapping of these errors to one-line messages needs the new text)."""
    kwargs, expect = MTLS_REFUSALS[case]
    error, elapsed = await _refusal(rig.mtls.address, **kwargs(rig))
    _assert_refused(error, elapsed, expect)


# ------------------------------------------------------------------------ API key


@pytest.mark.parametrize("proxy", ["api_key", "grpc_api_key"])
async def test_api_key_right_key_connects(rig: Rig, proxy: str) -> None:
    """The right key over TLS gets through either API-key proxy (HTTP/2 mode,
    h2c to the dev server). Red if the ``authorization`` match or the h2 backend
    is wrong."""
    target: TlsProxy = getattr(rig, proxy)
    client = await _connect(target.address, tls=rig.tls(), api_key=rig.key)
    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version


HTTP_401 = (
    AFTER_HANDSHAKE + 'Status { code: Internal, message: "protocol error: received message '
    "with invalid compression flag: 60 (valid flags are 0 and 1) while receiving response "
    'with status: 401 Unauthorized", metadata: MetadataMap { headers: {"content-length": '
    '"112", "cache-control": "no-cache", "content-type": "text/html"} }, source: None }'
)

API_KEY_REFUSALS: dict[
    str, tuple[Callable[[Rig], str], Callable[[Rig], dict[str, Any]], Expect]
] = {
    # HAProxy's 401 has an HTML body; tonic reads its '<' (60) as a gRPC frame
    # flag: INTERNAL, not UNAUTHENTICATED. Only the text says 401.
    "wrong key, HTTP 401": (
        lambda rig: rig.api_key.address,
        lambda rig: {"tls": rig.tls(), "api_key": "wrong-key"},
        Expect((HTTP_401,)),
    ),
    "no key, HTTP 401": (
        lambda rig: rig.api_key.address,
        lambda rig: {"tls": rig.tls()},
        Expect((HTTP_401,)),
    ),
    "wrong key, gRPC UNAUTHENTICATED": (
        lambda rig: rig.grpc_api_key.address,
        lambda rig: {"tls": rig.tls(), "api_key": "wrong-key"},
        Expect(
            (
                AFTER_HANDSHAKE + f'Status {{ code: Unauthenticated, message: "{REJECT_MESSAGE}", '
                'metadata: MetadataMap { headers: {"content-type": "application/grpc", '
                '"content-length": "0"} }, source: None }',
            )
        ),
    ),
    # tls=False on purpose: with an api_key and tls left unset the SDK turns TLS on.
    "right key over plaintext to the TLS port": (
        lambda rig: rig.api_key.address,
        lambda rig: {"tls": False, "api_key": rig.key},
        Expect((AFTER_HANDSHAKE,), CLOSED_UNDER_THE_CALL),
    ),
    "right key, tls unset (the SDK's default: TLS with the system roots)": (
        lambda rig: rig.api_key.address,
        lambda rig: {"api_key": rig.key},
        Expect(
            (
                "Failed client connect: Server connection error: tonic::transport::Error("
                "Transport, ConnectError(Custom { kind: InvalidData, error: InvalidCertificate("
                "UnknownIssuer) }))",
            )
        ),
    ),
    "right key with TLS to the plaintext dev server": (
        lambda rig: rig.temporal.address,
        lambda rig: {"tls": rig.tls(), "api_key": rig.key},
        Expect(
            (
                "Failed client connect: Server connection error: tonic::transport::Error("
                "Transport, ConnectError(Custom { kind: InvalidData, error: InvalidMessage("
                "InvalidContentType) }))",
            )
        ),
    ),
}


@pytest.mark.parametrize("case", list(API_KEY_REFUSALS))
async def test_api_key_refusals_are_quick_and_say_why(rig: Rig, case: str) -> None:
    """Each wrong API-key setup fails within 10 s with the RuntimeError pinned
    here. Red if a proxy let a wrong key through, if a case hung, or if the SDK's
    text changed (the product's one-line messages are keyed on it)."""
    address, kwargs, expect = API_KEY_REFUSALS[case]
    error, elapsed = await _refusal(address(rig), **kwargs(rig))
    _assert_refused(error, elapsed, expect)


@pytest.mark.parametrize(
    ("proxy", "status", "fragment"),
    [
        ("api_key", RPCStatusCode.INTERNAL, "401 Unauthorized"),
        ("grpc_api_key", RPCStatusCode.UNAUTHENTICATED, REJECT_MESSAGE),
    ],
)
async def test_key_refused_after_connecting_is_an_rpc_error(
    rig: Rig, proxy: str, status: RPCStatusCode, fragment: str
) -> None:
    """A key refused once connected (revoked, rotated: here ``client.api_key`` is
    changed) raises ``RPCError`` on the call, not the connect-time RuntimeError.
    Red if the SDK stopped sending the new key or changed the error type."""
    target: TlsProxy = getattr(rig, proxy)
    client = await _connect(target.address, tls=rig.tls(), api_key=rig.key)
    client.api_key = "revoked-key"
    started = time.monotonic()
    with pytest.raises(RPCError) as caught:
        await asyncio.wait_for(
            client.workflow_service.count_workflow_executions(
                CountWorkflowExecutionsRequest(namespace="default")
            ),
            15,
        )
    elapsed = time.monotonic() - started
    print(f"{proxy}: RPCError {caught.value.status!r} after {elapsed:.3f} s: {caught.value}")
    assert elapsed < _BOUND_S
    assert caught.value.status == status
    assert fragment in str(caught.value)


# --------------------------------------------------------------------- long polls


async def test_long_polls_outlast_the_dev_servers_expiry_through_both_proxies(
    rig: Rig,
) -> None:
    """A worker's poll on an idle task queue waits until the server gives up (about
    a minute; the SDK's deadline is 70 s) and then gets an empty answer. Through
    both proxies it must come back as that empty answer, not as HAProxy cutting a
    silent connection (504 in HTTP mode, a reset in TCP mode). Red if a proxy
    timeout drops below the long poll. Slow on purpose: about a minute, both at once."""
    mtls = await _connect(rig.mtls.address, tls=rig.tls(client="client"))
    api = await _connect(rig.api_key.address, tls=rig.tls(), api_key=rig.key)

    async def idle_poll(client: Client) -> float:
        started = time.monotonic()
        answer = await client.workflow_service.poll_workflow_task_queue(
            PollWorkflowTaskQueueRequest(
                namespace="default",
                task_queue=TaskQueue(name=f"tls-rig-idle-{uuid.uuid4().hex[:8]}"),
                identity="tls-rig",
            ),
            timeout=timedelta(seconds=85),
        )
        assert not answer.task_token
        return time.monotonic() - started

    waited = await asyncio.wait_for(asyncio.gather(idle_poll(mtls), idle_poll(api)), 100)
    print(f"idle polls returned after {waited[0]:.1f} s (mTLS) and {waited[1]:.1f} s (API key)")
    # Shorter would mean the server answered early and nothing was proved.
    assert all(seconds > 30 for seconds in waited), waited


# -------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    temporal = servers._find_binary("temporal", servers.TEMPORAL_HINT)
    # A developer's TEMPORAL_* variables (or profile) must not redirect the CLI.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env["TEMPORAL_CONFIG_FILE"] = os.devnull
    result = subprocess.run(
        [temporal, "workflow", "list", "--namespace", "default", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    print(f"temporal {args}: exit {result.returncode}\n{result.stdout}{result.stderr}")
    return result


def test_temporal_cli_through_each_proxy(rig: Rig) -> None:
    """The ``temporal`` CLI (Go, not rustls) lists workflows through both proxies
    with its TLS flags, and names a wrong key "authentication failed" even through
    the 401. Red if the rig only worked for the Python SDK."""
    ca, name = str(rig.pki.server_ca), SERVER_NAME
    mtls = _cli(
        "--address", rig.mtls.address,
        "--tls-ca-path", ca,
        "--tls-cert-path", str(rig.pki.client_cert),
        "--tls-key-path", str(rig.pki.client_key),
        "--tls-server-name", name,
    )  # fmt: skip
    assert mtls.returncode == 0, mtls.stderr
    for proxy in (rig.api_key, rig.grpc_api_key):
        api = _cli(
            "--address", proxy.address,
            "--tls-ca-path", ca,
            "--tls-server-name", name,
            "--api-key", rig.key,
        )  # fmt: skip
        assert api.returncode == 0, api.stderr
        wrong = _cli(
            "--address", proxy.address,
            "--tls-ca-path", ca,
            "--tls-server-name", name,
            "--api-key", "wrong-key",
        )  # fmt: skip
        assert wrong.returncode == 1
        assert "authentication failed" in wrong.stderr, wrong.stderr
