"""The edges' figures (``python -m bench --edges``): for each edge kind beside its
real server (HAProxy over its runtime API, nginx reading files, Caddy asking an
endpoint), with ``certflow edge`` as a separate process reading a database of its
own:

- latency: N rows made ACTIVE one after the other, at random moments (a
  certificate written as the worker writes it), each timed from its commit to the
  first handshake with that SNI that returns its serial; then each renewed (a new
  certificate and serial), timed the same way. p50 and p99.
- cold convergence: C certificates in the rows, an edge that holds none (a fresh
  server), ``certflow edge`` started: the time until its "converged" line, from
  its start and from when its connection to Postgres was open; the edge's RSS
  after (all its processes) and what ``certflow edge`` itself holds.
- handshakes per second: full handshakes (no resumption) from two client
  processes for T seconds, with the SNI of a certflow certificate, beside the same
  server's static certificate in its configuration (HAProxy: its default
  certificate, same process; nginx and Caddy: a second one of the same binary
  whose configuration names a fixed certificate), same run. Two cores for clients and server alike: the ratio is the
  figure, the absolute rates are this machine's.

Rows are planted with SQL: what an edge follows is rows and their events,
however a certificate got there; issuance's own cost is the other phases'.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bench.stack import Stack
from bench.stats import percentile
from certflow.crypto import EncryptionKey
from certflow.store.db import migrate
from devstack import haproxy as devhaproxy
from devstack import nginx as devnginx
from devstack.pki import self_signed
from devstack.servers import free_port

Log = Callable[[str], None]
REPO = Path(__file__).resolve().parent.parent
KINDS = ("haproxy", "files", "caddy")
PARENT = "bench-edges.test"
WAIT = 30.0
"""At most this long for one change to be served (a figure past it is a failure)."""


_INSERT = """
    INSERT INTO certificates (hostname, status, ssl_certificate, ssl_certificate_chain,
        encrypted_ssl_private_key, ssl_serial, ssl_expires_at, workflow_seen_at)
    VALUES ($1, 'ACTIVE', $2, '', $3, $4, now() + interval '30 days', now())
"""
_RENEW = """
    UPDATE certificates SET ssl_certificate = $2, encrypted_ssl_private_key = $3, ssl_serial = $4
    WHERE hostname = $1
"""


def _row(hostname: str, key: EncryptionKey) -> tuple[int, tuple[str, str, bytes, str]]:
    cert, cert_pem, key_pem = self_signed(hostname)
    return cert.serial_number, (hostname, cert_pem.decode(), key.encrypt(key_pem), format(cert.serial_number, "x"))


# -- the servers -------------------------------------------------------------------------


@dataclass
class EdgeServer:
    """One running edge: where it serves TLS, its processes, how to stop it, and
    the arguments ``certflow edge`` needs for it."""

    https_port: int
    pids: Callable[[], list[int]]
    stop: Callable[[], None]
    edge_args: list[str]
    edge_env: dict[str, str] = field(default_factory=dict)
    static_port: int | None = None
    """Where the same server serves one static certificate, when it is another process."""
    static_sni: str = "unknown.bench-static.test"


def _tree(pid: int) -> list[int]:
    """pid and its descendants."""
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        found += [int(c) for c in children]
        frontier += [int(c) for c in children]
    return found


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def start_server(kind: str, workdir: Path, default_pem: bytes) -> EdgeServer:
    """The edge of this kind on its shipped configuration (devstack/)."""
    if kind == "haproxy":
        server = devhaproxy.start_haproxy(workdir, default_pem=default_pem, responder="127.0.0.1:9")
        return EdgeServer(
            server.https_port, lambda: _tree(server.master_pid), server.stop,
            ["--kind", "haproxy", "--socket", str(server.socket), "--crt-list", str(server.crt_list)],
        )
    if kind == "files":
        directory = workdir / "edge"
        directory.mkdir(parents=True)
        workdir.chmod(0o711)
        owner = ["--owner", devnginx.WORKER_USER] if os.geteuid() == 0 else []
        nginx = devnginx.start_nginx(workdir / "nginx", edge_dir=directory, default_pem=default_pem, responder="127.0.0.1:9")
        static_port, stop_static = _static_nginx(workdir / "static", default_pem)

        def stop() -> None:
            nginx.stop()
            stop_static()

        return EdgeServer(
            nginx.https_port, lambda: _tree(nginx.master_pid), stop,
            ["--kind", "files", "--dir", str(directory), *owner], static_port=static_port,
        )
    if kind == "caddy":
        from devstack import caddy as devcaddy

        listen = f"127.0.0.1:{free_port()}"
        secret = secrets.token_urlsafe(24)
        caddy = devcaddy.start_caddy(workdir, default_pem=default_pem, responder="127.0.0.1:9", edge=listen, secret=secret)
        static_port, stop_static = _static_caddy(workdir / "static", default_pem)

        def stop_both() -> None:
            caddy.stop()
            stop_static()

        return EdgeServer(
            caddy.https_port, lambda: _tree(caddy.pid), stop_both,
            ["--kind", "caddy", "--listen", listen], {"CERTFLOW_EDGE_SECRET": secret},
            static_port=static_port,
        )
    raise ValueError(f"unknown edge kind {kind!r}")


def _static_nginx(workdir: Path, pem: bytes) -> tuple[int, Callable[[], None]]:
    """A second nginx serving one fixed certificate file, as a configuration without
    certflow would: the baseline for the files kind's handshake rate."""
    workdir.mkdir(parents=True)
    (workdir / "logs").mkdir()
    (workdir / "static.pem").write_bytes(pem)
    port = free_port()
    root = os.geteuid() == 0
    if root:
        shutil.chown(workdir / "static.pem", devnginx.WORKER_USER, devnginx.WORKER_GROUP)
    (workdir / "nginx.conf").write_text(f"""
{f"user {devnginx.WORKER_USER} {devnginx.WORKER_GROUP};" if root else ""}
daemon off; master_process on; worker_processes 1; pid {workdir}/nginx.pid;
error_log {workdir}/logs/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi; uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {workdir}/static.pem;
        ssl_certificate_key {workdir}/static.pem;
        ssl_session_cache off; ssl_session_tickets off;
        return 204;
    }}
}}
""")
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    process = subprocess.Popen(
        [binary, "-p", str(workdir), "-c", str(workdir / "nginx.conf"), "-e", str(workdir / "logs/error.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not _open(port):
        if time.monotonic() > deadline:
            raise RuntimeError("the static nginx did not start")
        time.sleep(0.05)

    def stop() -> None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)

    return port, stop


def _static_caddy(workdir: Path, pem: bytes) -> tuple[int, Callable[[], None]]:
    """A second Caddy serving one certificate from its Caddyfile (``tls cert key``),
    as a configuration without certflow would: the caddy kind's baseline (the
    shipped file's default certificate is itself fetched per handshake)."""
    workdir.mkdir(parents=True)
    cert_pem = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.PEM)
    (workdir / "static.crt").write_bytes(cert_pem)
    (workdir / "static.key").write_bytes(pem[len(cert_pem):])  # pem is the certificate, then its key
    port = free_port()
    (workdir / "Caddyfile").write_text(f"""{{
	admin off
	auto_https off
	default_bind 127.0.0.1
	https_port {port}
}}

https:// {{
	tls {workdir}/static.crt {workdir}/static.key
	respond 204
}}
""")
    env = {**os.environ, "HOME": str(workdir), "XDG_DATA_HOME": str(workdir / "data"),
           "XDG_CONFIG_HOME": str(workdir / "config")}
    binary = shutil.which("caddy") or "/usr/bin/caddy"
    with (workdir / "caddy.log").open("ab") as out:
        process = subprocess.Popen(
            [binary, "run", "--config", str(workdir / "Caddyfile"), "--adapter", "caddyfile"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )
    deadline = time.monotonic() + 20
    while not _open(port):
        if time.monotonic() > deadline:
            raise RuntimeError("the static Caddy did not start")
        time.sleep(0.05)

    def stop() -> None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)

    return port, stop


def _open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# -- certflow edge -----------------------------------------------------------------------


class EdgeProcess:
    """``starter.py edge`` as a child process, its JSON log lines kept."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = [sys.executable, "starter.py", "edge", *args]
        self.env = env
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def messages(self) -> list[tuple[float, str]]:
        """(time, message) of each log line so far."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            at = datetime.datetime.fromisoformat(str(record.get("time"))).timestamp()
            found.append((at, str(record.get("message", ""))))
        return found

    def stop(self) -> None:
        if self.popen is not None:
            self.popen.send_signal(signal.SIGTERM)
            self.popen.wait(30)
            self.popen = None


# -- measuring ---------------------------------------------------------------------------


def served_serial(port: int, sni: str) -> int | None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            with context.wrap_socket(sock, server_hostname=sni) as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return None if der is None else x509.load_der_x509_certificate(der).serial_number


async def _time_until_served(port: int, sni: str, serial: int, since: float) -> float:
    while True:
        if await asyncio.to_thread(served_serial, port, sni) == serial:
            return time.monotonic() - since
        if time.monotonic() - since > WAIT:
            raise RuntimeError(f"{sni}: serial {serial:x} not served within {WAIT} s")
        await asyncio.sleep(0.005)


def _handshakes(port: int, sni: str, seconds: float) -> int:
    """Full handshakes done in ``seconds`` (a new session each: no resumption)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    done, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            with context.wrap_socket(sock, server_hostname=sni):
                done += 1
    return done


def handshake_rate(port: int, sni: str, seconds: float, clients: int = 2) -> float:
    with ProcessPoolExecutor(clients) as pool:
        counts = list(pool.map(_handshakes, [port] * clients, [sni] * clients, [seconds] * clients))
    return sum(counts) / seconds


async def run_edges(
    stack: Stack, kinds: list[str], n: int, cold: int, seconds: float, workdir: Path, log: Log
) -> dict[str, Any]:
    """Each kind's figures (module docstring)."""
    results: dict[str, Any] = {"n": n, "cold": cold, "handshake_seconds": seconds, "kinds": {}}
    _, default_cert, default_key = self_signed("default.bench-edges.invalid")
    for kind in kinds:
        if kind == "caddy" and shutil.which("caddy") is None:
            log("edges: caddy not installed; skipped")
            continue
        log(f"edges: {kind}")
        results["kinds"][kind] = await _run_kind(
            stack, kind, n, cold, seconds, workdir / kind, default_cert + default_key, log
        )
    return results


async def _run_kind(
    stack: Stack, kind: str, n: int, cold: int, seconds: float, workdir: Path, default_pem: bytes, log: Log
) -> dict[str, Any]:
    _, url = stack.new_database(f"edges_{kind}")
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
    assert pool is not None
    await migrate(pool)
    raw = secrets.token_bytes(32)
    key = EncryptionKey(raw)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")},
        "CERTFLOW_DATABASE_URL": url,
        "CERTFLOW_ENCRYPTION_KEY": base64.b64encode(raw).decode(),
    }
    found: dict[str, Any] = {}
    workdir.mkdir(parents=True)
    try:
        # Latency: one row at a time, then its renewal.
        server = start_server(kind, workdir / "latency", default_pem)
        edge = EdgeProcess(server.edge_args, {**env, **server.edge_env}, workdir / "edge-latency.log")
        edge.start()
        try:
            warm = f"warm.{PARENT}"
            serial, row = await asyncio.to_thread(_row, warm, key)
            await pool.execute(_INSERT, *row)
            await _time_until_served(server.https_port, warm, serial, time.monotonic())
            active, renewed = [], []
            # Changes arrive at random moments, not in step with the follower's reads
            # (one right after the last was served would always wait a whole poll).
            arrivals = random.Random(n)
            for i in range(n):
                name = f"l{i}.{PARENT}"
                serial, row = await asyncio.to_thread(_row, name, key)
                await asyncio.sleep(arrivals.uniform(0, 1.0))
                await pool.execute(_INSERT, *row)
                active.append(await _time_until_served(server.https_port, name, serial, time.monotonic()))
            for i in range(n):
                name = f"l{i}.{PARENT}"
                serial, row = await asyncio.to_thread(_row, name, key)
                await asyncio.sleep(arrivals.uniform(0, 1.0))
                await pool.execute(_RENEW, *row)
                renewed.append(await _time_until_served(server.https_port, name, serial, time.monotonic()))
            found["active_to_served"] = _summary(active)
            found["renewal_to_served"] = _summary(renewed)
            log(f"  {kind}: ACTIVE→served p50 {found['active_to_served']['p50']} s p99 {found['active_to_served']['p99']} s;"
                f" renewal→served p50 {found['renewal_to_served']['p50']} s p99 {found['renewal_to_served']['p99']} s")

            # Handshakes per second, certflow's certificate beside a static one.
            served_sni = f"l0.{PARENT}"
            static_port = server.static_port or server.https_port
            rates = []
            for _ in range(2):  # alternated, so a drift in the machine's load touches both
                rates.append((await asyncio.to_thread(handshake_rate, server.https_port, served_sni, seconds),
                              await asyncio.to_thread(handshake_rate, static_port, server.static_sni, seconds)))
            certflow_rate = sum(r[0] for r in rates) / len(rates)
            static_rate = sum(r[1] for r in rates) / len(rates)
            found["handshakes_per_second"] = {
                "certflow": round(certflow_rate, 1), "static": round(static_rate, 1),
                "ratio": round(certflow_rate / static_rate, 3) if static_rate else None,
            }
            log(f"  {kind}: handshakes/s {certflow_rate:.0f} with certflow's certificate,"
                f" {static_rate:.0f} static ({found['handshakes_per_second']['ratio']}x)")
        finally:
            edge.stop()
            server.stop()

        # Cold convergence of `cold` certificates into an edge that holds none.
        await pool.execute("DELETE FROM certificates")
        log(f"  {kind}: planting {cold} certificates")

        def rows_from(start: int) -> list[tuple[str, str, bytes, str]]:
            return [_row(f"c{i}.{PARENT}", key)[1] for i in range(start, min(start + 500, cold))]

        rows = []
        for start in range(0, cold, 500):
            batch = await asyncio.to_thread(rows_from, start)
            rows += batch
            await pool.executemany(_INSERT, batch)
        server = start_server(kind, workdir / "cold", default_pem)
        edge = EdgeProcess(server.edge_args, {**env, **server.edge_env}, workdir / "edge-cold.log")
        edge.start()
        try:
            wall_start = time.time()
            deadline = time.monotonic() + 600
            converged = None
            while converged is None:
                for at, message in edge.messages():
                    if message.startswith("edge: converged:"):
                        converged = (at, message)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind}: no convergence of {cold} within 600 s")
                await asyncio.sleep(0.2)
            keeping = next((at for at, m in edge.messages() if m.startswith("edge: keeping")), wall_start)
            last = rows[-1][0]
            found["cold_converge"] = {
                "certificates": cold,
                "seconds_from_start": round(converged[0] - wall_start, 2),
                "seconds_from_first_line": round(converged[0] - keeping, 2),
                "line": converged[1],
                "edge_rss_mib": round(rss_kib(server.pids()) / 1024, 1),
                "certflow_edge_rss_mib": round(rss_kib([edge.popen.pid]) / 1024, 1) if edge.popen else None,
                "last_served": served_serial(server.https_port, last) is not None,
            }
            if kind == "files":
                directory = Path(server.edge_args[server.edge_args.index("--dir") + 1])
                found["cold_converge"]["directory_mib"] = round(
                    sum(p.stat().st_size for p in directory.iterdir()) / 2**20, 1
                )
            log(f"  {kind}: cold convergence of {cold}: {found['cold_converge']}")
        finally:
            edge.stop()
            server.stop()
    finally:
        await pool.close()
    return found


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50) or 0.0, 3),
        "p99": round(percentile(values, 99) or 0.0, 3),
        "max": round(max(values), 3),
    }


def table(found: dict[str, Any]) -> str:
    """The figures as docs/performance.md shows them."""
    lines = [
        f"| edge | ACTIVE → served p50 / p99 (N={found['n']}) | renewal → served p50 / p99 |"
        f" cold convergence of {found['cold']:,} | edge RSS after | handshakes/s certflow / static |",
        "|---|---|---|---|---|---|",
    ]
    for kind, f in found["kinds"].items():
        a, r, c, h = f["active_to_served"], f["renewal_to_served"], f["cold_converge"], f["handshakes_per_second"]
        lines.append(
            f"| {kind} | {a['p50']} / {a['p99']} s | {r['p50']} / {r['p99']} s | {c['seconds_from_start']} s"
            f" ({c['seconds_from_first_line']} s after its first line) | {c['edge_rss_mib']} MiB |"
            f" {h['certflow']:.0f} / {h['static']:.0f} ({h['ratio']}×) |"
        )
    return "\n".join(lines)
