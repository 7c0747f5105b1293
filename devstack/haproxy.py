"""HAProxy as a child process for tests: ``deploy/haproxy/certflow.cfg`` as shipped,
only its ports and paths changed, run in master-worker mode (``-W -db``) as
Debian's systemd unit runs it (``-Ws``), so the master's pid and a reload are as
in production.

Debian's HAProxy 2.6; scripts/setup.sh installs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devstack.servers import StackError, _Process, _require_free, _tcp_open, free_port
from devstack.temporal_tls import _find_haproxy

SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "haproxy" / "certflow.cfg"

# What the test changes in the shipped file: nothing else.
_SOCKET = "/run/haproxy/admin.sock"
_BIND_80 = "bind :80"
_BIND_443 = "bind :443"
_DEFAULT = "/etc/haproxy/certflow/default.pem"
_CRT_LIST = "/etc/haproxy/certflow.crtlist"
_RESPONDER = "server responder 127.0.0.1:8402"
_APP = "server app 127.0.0.1:8080"


@dataclass
class HAProxy:
    process: _Process
    workdir: Path
    http_port: int
    https_port: int
    socket: Path
    crt_list: Path

    @property
    def master_pid(self) -> int:
        assert self.process.popen is not None
        return self.process.popen.pid

    @property
    def log(self) -> Path:
        return self.process.log

    def start(self) -> None:
        """Start it (again): what was pushed over the runtime API is gone."""
        self.socket.unlink(missing_ok=True)
        self.process.start()
        self.process.wait_ready(
            lambda: self.socket.exists() and _tcp_open(self.https_port) and _tcp_open(self.http_port), 30
        )

    def stop(self) -> None:
        self.process.stop()


def shipped_config(
    workdir: Path, *, socket: Path, default_pem: Path, crt_list: Path, responder: str, app: str,
    http_port: int, https_port: int,
) -> str:
    """deploy/haproxy/certflow.cfg with only its ports and paths replaced (each must
    be there: a shipped file that drifts from what is tested fails here)."""
    text = SHIPPED.read_text()
    for old, new in (
        (_SOCKET, str(socket)),
        (_BIND_80, f"bind 127.0.0.1:{http_port}"),
        (_BIND_443, f"bind 127.0.0.1:{https_port}"),
        (_DEFAULT, str(default_pem)),
        (_CRT_LIST, str(crt_list)),
        (_RESPONDER, f"server responder {responder}"),
        (_APP, f"server app {app}"),
    ):
        if old not in text:
            raise StackError(f"deploy/haproxy/certflow.cfg no longer has {old!r}")
        text = text.replace(old, new)
    return text


def start_haproxy(
    workdir: Path, *, default_pem: bytes, responder: str, app: str = "127.0.0.1:9", http_port: int | None = None
) -> HAProxy:
    """HAProxy serving the shipped configuration; ``default_pem`` is the default
    certificate (chain and key)."""
    binary = _find_haproxy()
    workdir.mkdir(parents=True, exist_ok=True)
    default = workdir / "default.pem"
    default.write_bytes(default_pem)
    default.chmod(0o600)
    crt_list = workdir / "certflow.crtlist"
    crt_list.touch()
    http_port, https_port = http_port or free_port(), free_port()
    _require_free("haproxy", http_port)
    _require_free("haproxy", https_port)
    socket = workdir / "admin.sock"
    config = workdir / "haproxy.cfg"
    config.write_text(
        shipped_config(
            workdir, socket=socket, default_pem=default, crt_list=crt_list, responder=responder,
            app=app, http_port=http_port, https_port=https_port,
        )
    )
    process = _Process("haproxy-edge", [binary, "-W", "-db", "-f", str(config)], workdir / "haproxy.log")
    server = HAProxy(process, workdir, http_port, https_port, socket, crt_list)
    server.start()
    return server


__all__ = ["HAProxy", "shipped_config", "start_haproxy"]
