"""A real TLS terminator (HAProxy) in front of the Temporal dev server, for tests.

The dev server (``temporal server start-dev``) speaks plaintext gRPC only, while
production Temporal (Cloud, or self-hosted) wants TLS with a client certificate
(mTLS) or an API key over TLS. Debian's HAProxy 2.6 (scripts/setup.sh installs
it) terminates TLS in front of it:

- ``mode="mtls"``: TCP mode; the handshake requires a client certificate issued
  by the client CA, then the bytes go to the dev server unchanged.
- ``mode="api_key"``: HTTP/2 mode; a request without ``authorization: Bearer
  <key>`` is refused, the rest go to the dev server over h2c, long polls
  included. ``reject="http_401"`` refuses it as a plain HTTP proxy would (HTTP
  401 with an HTML body: the Python SDK reports gRPC ``INTERNAL`` "protocol
  error ... 401 Unauthorized", the Go CLI "unauthenticated");
  ``reject="grpc_unauthenticated"`` as a gRPC-aware gateway does (HTTP 200,
  ``grpc-status: 16``: ``UNAUTHENTICATED`` "invalid API key" everywhere).

:func:`write_temporal_pki` writes the throwaway certificates (a server CA and
leaf, a client CA and leaf, and an unrelated CA with its own client leaf for
"a client certificate from another CA"), every one X.509 v3 with extensions:
the SDK's rustls rejects v1 certificates (``UnsupportedCertVersion``).
"""

from __future__ import annotations

import ipaddress
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cryptography import x509

from devstack.pki import make_ca, make_leaf, write_private
from devstack.servers import StackError, _Process, _require_free, _tcp_open, free_port

__all__ = [
    "REJECT_MESSAGE",
    "SERVER_NAME",
    "TemporalPki",
    "TlsProxy",
    "start_tls_proxy",
    "write_temporal_pki",
]

SERVER_NAME = "temporal.certflow.test"
"""The name the proxy's certificate is for: the ``domain`` (``--tls-server-name``)
a client verifies against; it never needs to resolve."""

HAPROXY_HINT = "install it with `apt-get install haproxy` (scripts/setup.sh does)"

ProxyMode = Literal["mtls", "api_key"]
Reject = Literal["http_401", "grpc_unauthenticated"]

REJECT_MESSAGE = "invalid API key"
"""The gRPC message of a ``reject="grpc_unauthenticated"`` refusal."""

# A Temporal worker's long polls last up to 70 s (the SDK's deadline; the server
# answers an empty poll after about 60 s). HAProxy cuts a connection that is
# silent longer than these, so they stay well above that.
_IDLE_TIMEOUT = "90s"
_TUNNEL_TIMEOUT = "1h"
_READY_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------- PKI


@dataclass(frozen=True)
class TemporalPki:
    """Paths of the throwaway PKI (PEM; keys PKCS#8, mode 0600)."""

    directory: Path
    server_ca: Path
    """The CA clients trust for the proxy (``server_root_ca_cert``, ``--tls-ca-path``)."""
    server_cert: Path
    server_key: Path
    server_pem: Path
    """HAProxy's ``crt``: the server leaf followed by its key."""
    client_ca: Path
    """The CA the mTLS proxy accepts client certificates from (``ca-file``)."""
    client_cert: Path
    client_key: Path
    other_ca: Path
    """An unrelated CA: its client certificate must be refused."""
    other_client_cert: Path
    other_client_key: Path


def write_temporal_pki(directory: Path) -> TemporalPki:
    """Write a fresh server CA + leaf, client CA + leaf and other CA + client leaf.

    The server leaf is for ``temporal.certflow.test``, ``localhost`` and
    127.0.0.1 (EKU serverAuth); the client leaves carry EKU clientAuth.
    """
    directory.mkdir(parents=True, exist_ok=True)
    server_ca = make_ca("certflow test Temporal server CA")
    server = make_leaf(
        server_ca,
        SERVER_NAME,
        "server",
        [
            x509.DNSName(SERVER_NAME),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ],
    )
    client_ca = make_ca("certflow test Temporal client CA")
    client = make_leaf(client_ca, "worker.certflow.test", "client", [x509.DNSName("worker.certflow.test")])
    other_ca = make_ca("certflow test unrelated CA")
    other = make_leaf(other_ca, "worker.certflow.test", "client", [x509.DNSName("worker.certflow.test")])

    pki = TemporalPki(
        directory=directory,
        server_ca=directory / "server-ca.pem",
        server_cert=directory / "server-cert.pem",
        server_key=directory / "server-key.pem",
        server_pem=directory / "server.pem",
        client_ca=directory / "client-ca.pem",
        client_cert=directory / "client-cert.pem",
        client_key=directory / "client-key.pem",
        other_ca=directory / "other-ca.pem",
        other_client_cert=directory / "other-client-cert.pem",
        other_client_key=directory / "other-client-key.pem",
    )
    pki.server_ca.write_bytes(server_ca.cert_pem)
    pki.server_cert.write_bytes(server.cert_pem)
    write_private(pki.server_key, server.key_pem)
    write_private(pki.server_pem, server.cert_pem + server.key_pem)
    pki.client_ca.write_bytes(client_ca.cert_pem)
    pki.client_cert.write_bytes(client.cert_pem)
    write_private(pki.client_key, client.key_pem)
    pki.other_ca.write_bytes(other_ca.cert_pem)
    pki.other_client_cert.write_bytes(other.cert_pem)
    write_private(pki.other_client_key, other.key_pem)
    return pki


# -------------------------------------------------------------------------- proxy


@dataclass
class TlsProxy:
    """A running HAProxy terminating TLS for one Temporal dev server."""

    address: str
    """``127.0.0.1:PORT``, TLS only."""
    mode: ProxyMode
    pki: TemporalPki
    api_key: str | None
    """The key the ``api_key`` proxy demands (``None`` for ``mtls``: not checked)."""
    config: Path
    _process: _Process = field(repr=False)
    server_name: str = SERVER_NAME

    @property
    def log(self) -> Path:
        return self._process.log

    def stop(self) -> None:
        self._process.stop()


def haproxy_config(
    *,
    mode: ProxyMode,
    port: int,
    backend_port: int,
    pki: TemporalPki,
    api_key: str | None,
    reject: Reject = "http_401",
) -> str:
    """The HAProxy configuration of one proxy (see :func:`start_tls_proxy`)."""
    common = f"""\
global
    log stdout format raw local0 info
    maxconn 256

defaults
    log global
    timeout connect 5s
    timeout client {_IDLE_TIMEOUT}
    timeout server {_IDLE_TIMEOUT}
"""
    if mode == "mtls":
        return common + f"""\
    timeout tunnel {_TUNNEL_TIMEOUT}

frontend temporal_mtls
    mode tcp
    option tcplog
    bind 127.0.0.1:{port} ssl crt {pki.server_pem} ca-file {pki.client_ca} verify required alpn h2
    default_backend temporal

backend temporal
    mode tcp
    server dev 127.0.0.1:{backend_port}
"""
    if mode == "api_key":
        if not api_key or any(c in api_key for c in '"\\ \n'):
            raise ValueError("the API key must be non-empty, without quotes, spaces or backslashes")
        allowed = f'{{ req.hdr(authorization) -m str "Bearer {api_key}" }}'
        if reject == "http_401":
            refuse = f"    http-request deny deny_status 401 unless {allowed}\n"
        elif reject == "grpc_unauthenticated":
            # A trailers-only gRPC answer. HAProxy drops the content-type of a reply
            # without a body, and gRPC clients (the Go CLI) insist on it: set it after.
            refuse = (
                "    http-request return status 200 hdr grpc-status 16"
                f' hdr grpc-message "{REJECT_MESSAGE}" unless {allowed}\n'
                "    http-after-response set-header content-type application/grpc"
                " if { res.hdr(grpc-status) -m found }\n"
            )
        else:
            raise ValueError(f"unknown reject {reject!r}; 'http_401' or 'grpc_unauthenticated'")
        return common + f"""\

frontend temporal_api_key
    mode http
    option httplog
    bind 127.0.0.1:{port} ssl crt {pki.server_pem} alpn h2
{refuse}    default_backend temporal

backend temporal
    mode http
    server dev 127.0.0.1:{backend_port} proto h2
"""
    raise ValueError(f"unknown proxy mode {mode!r}; 'mtls' or 'api_key'")


def start_tls_proxy(
    workdir: Path,
    backend_port: int,
    *,
    mode: ProxyMode,
    pki: TemporalPki | None = None,
    api_key: str | None = None,
    reject: Reject = "http_401",
    port: int | None = None,
) -> TlsProxy:
    """Start HAProxy on a free loopback port in front of ``127.0.0.1:backend_port``.

    ``mode="mtls"`` demands a client certificate from ``pki.client_ca``;
    ``mode="api_key"`` demands ``authorization: Bearer <api_key>`` (a random key
    when none is given), refusing others as ``reject`` says (module docstring).
    ``pki``: a fresh one in ``<workdir>/pki`` when omitted. The config and the
    log (one line per connection or request) are ``haproxy-<mode>.cfg`` and
    ``.log`` in ``workdir`` (give each proxy of a mode its own workdir).
    Returns once the port accepts connections.
    """
    haproxy = _find_haproxy()
    workdir.mkdir(parents=True, exist_ok=True)
    pki = pki or write_temporal_pki(workdir / "pki")
    if mode == "api_key":
        api_key = api_key or secrets.token_urlsafe(24)
    else:
        api_key = None
    port = port or free_port()
    _require_free("haproxy", port)
    config = workdir / f"haproxy-{mode}.cfg"
    config.write_text(
        haproxy_config(
            mode=mode,
            port=port,
            backend_port=backend_port,
            pki=pki,
            api_key=api_key,
            reject=reject,
        )
    )
    process = _Process(
        f"haproxy-{mode}",
        # -db: stay in the foreground (no daemon, no master-worker), so stop() is a signal.
        [haproxy, "-db", "-f", str(config)],
        workdir / f"haproxy-{mode}.log",
    )
    proxy = TlsProxy(
        address=f"127.0.0.1:{port}",
        mode=mode,
        pki=pki,
        api_key=api_key,
        config=config,
        _process=process,
    )
    process.start()
    process.wait_ready(lambda: _tcp_open(port), _READY_TIMEOUT_S)
    return proxy


def _find_haproxy() -> str:
    # Debian puts it in /usr/sbin, which a non-root PATH often lacks.
    found = shutil.which("haproxy") or shutil.which(
        "haproxy", path="/usr/local/sbin:/usr/sbin:/sbin"
    )
    if found is None:
        raise StackError(f"`haproxy` not found on PATH or in /usr/sbin; {HAPROXY_HINT}")
    return found


if __name__ == "__main__":
    # `python -m devstack.temporal_tls pki DIR [--readable]`: the PKI for
    # docker-compose's `tls` profile (deploy/temporal/), made at run time rather
    # than committed. --readable: keys 0644, for containers running as another user.
    import sys

    if len(sys.argv) in (3, 4) and sys.argv[1] == "pki" and sys.argv[3:] in ([], ["--readable"]):
        written = write_temporal_pki(Path(sys.argv[2]))
        if sys.argv[3:]:
            for path in written.directory.iterdir():
                path.chmod(0o644)
        print(f"wrote the Temporal TLS PKI to {written.directory}")
    else:
        print("usage: python -m devstack.temporal_tls pki DIR [--readable]", file=sys.stderr)
        sys.exit(2)
