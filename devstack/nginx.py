"""nginx as a child process for tests: ``deploy/nginx/certflow.conf`` as shipped,
only its ports and paths changed, included in a main configuration of its own
(``-p``/``-c`` in a work directory, ``daemon off``, ``master_process on``).

Debian's nginx 1.22 with its njs module (``libnginx-mod-http-js``); scripts/setup.sh
installs both. Run as root, the workers run as ``nobody``: the files certflow
writes must then be owned by that user (``WORKER_USER``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from devstack.servers import StackError, _Process, _require_free, _tcp_open, free_port

NGINX_HINT = "install it with `apt-get install nginx libnginx-mod-http-js` (scripts/setup.sh does)"
JS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "nginx"
WORKER_USER, WORKER_GROUP = "nobody", "nogroup"
"""The workers' user and group when the master runs as root."""

# What the test changes in the shipped file: nothing else.
_LISTEN_80 = "listen 80 default_server;"
_LISTEN_443 = "listen 443 ssl default_server;"
_RESPONDER = "server 127.0.0.1:8402;"
_APP = "server 127.0.0.1:8080;"
_EDGE_DIR = "/run/certflow-edge"
_ETC = "/etc/nginx/certflow/"


@dataclass
class Nginx:
    process: _Process
    workdir: Path
    http_port: int
    https_port: int
    pid_file: Path

    @property
    def master_pid(self) -> int:
        return int(self.pid_file.read_text().strip())

    @property
    def error_log(self) -> Path:
        return self.workdir / "logs" / "error.log"

    def stop(self) -> None:
        self.process.stop()


def _binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None or not JS_MODULE.exists():
        raise StackError(f"nginx with its njs module not found; {NGINX_HINT}")
    return found


def shipped_config(edge_dir: Path, etc_dir: Path, responder: str, app: str, http_port: int, https_port: int) -> str:
    """deploy/nginx/certflow.conf with only its ports and paths replaced (each must
    be there: a shipped file that drifts from what is tested fails here)."""
    text = (SHIPPED / "certflow.conf").read_text()
    for old, new in (
        (_LISTEN_80, f"listen 127.0.0.1:{http_port} default_server;"),
        (_LISTEN_443, f"listen 127.0.0.1:{https_port} ssl default_server;"),
        (_RESPONDER, f"server {responder};"),
        (_APP, f"server {app};"),
        (_EDGE_DIR, str(edge_dir)),
        (_ETC, f"{etc_dir}/"),
    ):
        if old not in text:
            raise StackError(f"deploy/nginx/certflow.conf no longer has {old!r}")
        text = text.replace(old, new)
    return text


def start_nginx(
    workdir: Path, *, edge_dir: Path, default_pem: bytes, responder: str, app: str = "127.0.0.1:9",
    http_port: int | None = None,
) -> Nginx:
    """nginx serving the shipped configuration; ``default_pem`` is the default
    certificate (chain and key)."""
    binary = _binary()
    workdir.mkdir(parents=True, exist_ok=True)
    etc = workdir / "etc"
    etc.mkdir(exist_ok=True)
    shutil.copy(SHIPPED / "certflow.js", etc / "certflow.js")
    (etc / "default.pem").write_bytes(default_pem)
    (workdir / "logs").mkdir(exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    http_port, https_port = http_port or free_port(), free_port()
    _require_free("nginx", http_port)
    _require_free("nginx", https_port)
    (workdir / "certflow.conf").write_text(
        shipped_config(edge_dir, etc, responder, app, http_port, https_port)
    )
    root = os.geteuid() == 0
    if root:  # the workers must read what certflow writes, and the default certificate
        for path in (workdir, etc, etc / "certflow.js", etc / "default.pem"):
            shutil.chown(path, WORKER_USER, WORKER_GROUP)
    tmp = workdir / "tmp"
    main = f"""
{f"user {WORKER_USER} {WORKER_GROUP};" if root else ""}
daemon off;
master_process on;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/logs/error.log info;
load_module {JS_MODULE};
events {{ worker_connections 256; }}
http {{
    access_log {workdir}/logs/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {workdir}/certflow.conf;
}}
"""
    (workdir / "nginx.conf").write_text(main)
    binary_argv = [binary, "-p", str(workdir), "-c", str(workdir / "nginx.conf"), "-e", str(workdir / "logs/error.log")]
    process = _Process("nginx", binary_argv, workdir / "nginx.log")
    process.start()
    pid_file = workdir / "nginx.pid"
    process.wait_ready(lambda: _tcp_open(https_port) and _tcp_open(http_port) and pid_file.exists(), 30)
    return Nginx(process, workdir, http_port, https_port, pid_file)


__all__ = ["Nginx", "WORKER_GROUP", "WORKER_USER", "shipped_config", "start_nginx"]
