"""Caddy as a child process for tests: ``deploy/caddy/Caddyfile`` as shipped,
only its ports, upstreams and the default certificate's directory changed, and
bound to loopback (``default_bind``) so a test never listens beyond this host.

Debian's caddy 2.6.2 (``apt-get install caddy``; scripts/setup.sh installs it).
Its storage and its config autosave (which holds the secret the Caddyfile reads
from ``CERTFLOW_EDGE_SECRET``) go to the work directory, never ``~``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from devstack.servers import StackError, _Process, _require_free, _tcp_open, free_port

CADDY_HINT = "install it with `apt-get install caddy` (scripts/setup.sh does)"
SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "caddy" / "Caddyfile"

# What the test changes in the shipped file: nothing else.
_ADMIN = "\tadmin off\n"
_HTTP_PORT = "\thttp_port 80\n"
_HTTPS_PORT = "\thttps_port 443\n"
_RESPONDER = "reverse_proxy 127.0.0.1:8402"
_APP = "reverse_proxy 127.0.0.1:8080"
_EDGE = "@127.0.0.1:8404/certificate"
_DEFAULT = "127.0.0.1:8405"
_ETC = "/etc/caddy/certflow"


@dataclass
class Caddy:
    process: _Process
    workdir: Path
    http_port: int
    https_port: int
    default_port: int
    """Where the shipped file's second site serves the default certificate."""

    @property
    def pid(self) -> int:
        assert self.process.popen is not None
        return self.process.popen.pid

    @property
    def log(self) -> Path:
        """Caddy's own log (JSON lines on stderr)."""
        return self.process.log

    def log_text(self) -> str:
        return self.process.log.read_text(errors="replace")

    @property
    def data_dir(self) -> Path:
        """Caddy's storage: certificates it obtained itself would be under it."""
        return self.workdir / "data" / "caddy"

    def stop(self) -> None:
        self.process.stop()


def _binary() -> str:
    found = shutil.which("caddy")
    if found is None:
        raise StackError(f"caddy not found; {CADDY_HINT}")
    return found


def shipped_config(
    *, etc_dir: Path, responder: str, app: str, edge: str, http_port: int, https_port: int, default_port: int
) -> str:
    """deploy/caddy/Caddyfile with only its ports, upstreams and paths replaced
    (each must be there: a shipped file that drifts from what is tested fails here)."""
    text = SHIPPED.read_text()
    for old, new in (
        (_ADMIN, f"{_ADMIN}\tdefault_bind 127.0.0.1\n"),
        (_HTTP_PORT, f"\thttp_port {http_port}\n"),
        (_HTTPS_PORT, f"\thttps_port {https_port}\n"),
        (_RESPONDER, f"reverse_proxy {responder}"),
        (_APP, f"reverse_proxy {app}"),
        (_EDGE, f"@{edge}/certificate"),
        (_DEFAULT, f"127.0.0.1:{default_port}"),
        (_ETC, str(etc_dir)),
    ):
        if old not in text:
            raise StackError(f"deploy/caddy/Caddyfile no longer has {old!r}")
        text = text.replace(old, new)
    return text


def start_caddy(
    workdir: Path, *, edge: str, secret: str, default_pem: bytes, responder: str, app: str = "127.0.0.1:9",
    http_port: int | None = None,
) -> Caddy:
    """Caddy serving the shipped Caddyfile, asking ``certflow edge --kind caddy``
    at ``edge`` (host:port) with ``secret``; ``default_pem`` is the default
    certificate (chain then key)."""
    binary = _binary()
    workdir.mkdir(parents=True, exist_ok=True)
    etc = workdir / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "default.pem").write_bytes(default_pem)
    http_port, https_port, default_port = http_port or free_port(), free_port(), free_port()
    for port in (http_port, https_port, default_port):
        _require_free("caddy", port)
    caddyfile = workdir / "Caddyfile"
    caddyfile.write_text(
        shipped_config(
            etc_dir=etc, responder=responder, app=app, edge=edge,
            http_port=http_port, https_port=https_port, default_port=default_port,
        )
    )
    env = {
        "CERTFLOW_EDGE_SECRET": secret,
        "HOME": str(workdir),
        "XDG_DATA_HOME": str(workdir / "data"),
        "XDG_CONFIG_HOME": str(workdir / "config"),
    }
    argv = [binary, "run", "--config", str(caddyfile), "--adapter", "caddyfile"]
    process = _Process("caddy", argv, workdir / "caddy.log", env=env)
    process.start()
    process.wait_ready(
        lambda: all(_tcp_open(port) for port in (http_port, https_port, default_port)), 30
    )
    return Caddy(process, workdir, http_port, https_port, default_port)


__all__ = ["Caddy", "shipped_config", "start_caddy"]
