"""acme2certifier: a real ACME CA that offers ``dns-persist-01`` (Pebble 2.4 does not).

``start_acme2certifier`` runs acme2certifier 0.46.3 (a Python ACME server,
https://github.com/grindsa/acme2certifier) under gunicorn, from its own
virtualenv in ``.venv-a2c`` (made by ``scripts/setup.sh``) so its dependencies
never touch certflow's. It keeps its state in an SQLite file and signs with its
``openssl_ca_handler`` (pure ``cryptography``, no openssl binary): a root and an
issuing CA generated at start in the work directory. It serves HTTPS on a free
loopback port with a certificate from :func:`devstack.servers.write_tls_files`.

Challenges offered: ``dns-persist-01`` (draft-ietf-acme-dns-persist), ``dns-01``
and ``http-01`` (a2c fetches it from port 80 of the host's address: there is no
port setting). ``tls-alpn-01`` is off (port 443, nothing here serves it).

dns-persist-01 as acme2certifier checks it: when the client POSTs to the
challenge URL, it looks up TXT ``_validation-persist.<host>`` (``*.`` stripped)
through ``resolver_ip`` port 53 and accepts the first record whose issuer (the
part before the first ``;``, case-insensitive) is one of its
``[Directory] caaidentities`` (our ``issuer_domain``), whose ``accounturi``
equals the ordering account's URL exactly, whose ``persistUntil`` (if any) is
not past and, for a ``*.`` identifier, that has ``policy=wildcard``. Only the
first character-string of each TXT record is read.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import sqlite3
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devstack.servers import (
    StackError,
    _answers,
    _Process,
    _request,
    _require_free,
    free_port,
    write_tls_files,
)

__all__ = [
    "A2C_HINT",
    "A2C_VENV",
    "DEFAULT_ISSUER_DOMAIN",
    "Acme2CertifierStack",
    "start_acme2certifier",
]

A2C_VENV = Path(__file__).resolve().parent.parent / ".venv-a2c"
"""acme2certifier's own virtualenv in the checkout (made by scripts/setup.sh)."""

A2C_HINT = "run scripts/setup.sh (it creates .venv-a2c with acme2certifier and gunicorn)"

DEFAULT_ISSUER_DOMAIN = "a2c.test"
"""The issuer domain name a dns-persist-01 record must name for this CA."""

_START_TIMEOUT_S = 60.0
# Validation runs in a thread the challenge POST waits for, up to this long.
_VALIDATION_TIMEOUT_S = 10
_CERT_VALIDITY_DAYS = 90


@dataclass(frozen=True)
class Acme2CertifierStack:
    """A running acme2certifier; its files (config, CA, database, log) live in ``workdir``."""

    directory_url: str
    ca_bundle: Path
    """PEM that verifies the ACME server's TLS certificate."""
    root_pem: Path
    """PEM of the root that issued chains (leaf + issuing CA) verify against."""
    issuer_domain: str
    resolver_ip: str
    workdir: Path
    config_file: Path
    log: Path
    _process: _Process = field(repr=False)

    def stop(self) -> None:
        """Stop gunicorn and its worker (idempotent); the files stay."""
        self._process.stop()

    def orders_for(self, hostname: str) -> int:
        """How many orders the CA created that name ``hostname`` (read from its own
        database, as a count at the CA)."""
        with contextlib.closing(sqlite3.connect(self.workdir / "acme_srv.db")) as db:
            rows = db.execute("SELECT identifiers FROM orders").fetchall()
        return sum(
            1
            for (identifiers,) in rows
            if any(i.get("value") == hostname for i in json.loads(identifiers))
        )


def start_acme2certifier(
    workdir: Path,
    *,
    resolver_ip: str,
    issuer_domain: str = DEFAULT_ISSUER_DOMAIN,
    port: int | None = None,
    jit_validation: bool = False,
    debug: bool = False,
    venv: Path = A2C_VENV,
    timeout: float = _START_TIMEOUT_S,
) -> Acme2CertifierStack:
    """Configure and start acme2certifier in ``workdir``; block until its directory answers.

    ``resolver_ip``: the recursive resolver it validates with (a bare IP; it
    asks port 53), e.g. ``RealDns.resolver_ip``. ``issuer_domain``: the name
    dns-persist-01 records must start with (its CAA identity too).
    ``jit_validation``: a2c validates a dns-persist-01 record already when the
    authorization is fetched, without the challenge POST (off: the draft's
    flow). ``debug``: a2c's debug log (very verbose).
    """
    python = venv / "bin" / "python"
    for tool in (python, venv / "bin" / "gunicorn", venv / "bin" / "a2c-cli"):
        if not os.access(tool, os.X_OK):
            raise StackError(f"acme2certifier is not installed ({tool} missing); {A2C_HINT}")
    try:
        ipaddress.ip_address(resolver_ip)
    except ValueError:
        raise ValueError(f"resolver_ip must be a bare IP address, not {resolver_ip!r}") from None
    issuer_domain = issuer_domain.strip().lower().rstrip(".")
    if not issuer_domain or any(c in issuer_domain for c in ' ;="'):
        raise ValueError(f"not a usable issuer domain name: {issuer_domain!r}")

    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    ca_bundle, tls_cert, tls_key = write_tls_files(_subdir(workdir / "tls"))
    root_pem, issuing_cert, issuing_key = _write_issuing_ca(_subdir(workdir / "ca"))
    certs = workdir / "certs"
    certs.mkdir(exist_ok=True)
    database = workdir / "acme_srv.db"
    # A fresh CA: an earlier run's accounts, orders and CRL mean nothing to it.
    database.unlink(missing_ok=True)
    crl = workdir / "ca" / "issuing-ca.crl"
    crl.unlink(missing_ok=True)

    port = port or free_port()
    _require_free("acme2certifier", port)
    config_file = workdir / "acme_srv.cfg"
    config_file.write_text(
        _config(
            resolver_ip=resolver_ip,
            issuer_domain=issuer_domain,
            database=database,
            issuing_cert=issuing_cert,
            issuing_key=issuing_key,
            crl=crl,
            certs=certs,
            jit_validation=jit_validation,
            debug=debug,
        )
    )
    argv = [
        # -I: no PYTHONPATH or user site from our environment in a2c's venv.
        str(python), "-I", "-m", "gunicorn",
        "--bind", f"127.0.0.1:{port}",
        "--certfile", str(tls_cert),
        "--keyfile", str(tls_key),
        # One process (one SQLite writer); threads so a slow validation does not
        # hold up other requests.
        "--workers", "1",
        "--worker-class", "gthread",
        "--threads", "4",
        "--graceful-timeout", "3",
        "--chdir", str(workdir),
        "--no-control-socket",
        "--access-logfile", "-",
        "--error-logfile", "-",
        "acme2certifier.share.acme2certifier_wsgi:application",
    ]
    process = _Process(
        "acme2certifier",
        argv,
        workdir / "acme2certifier.log",
        env={
            "ACME_SRV_CONFIGFILE": str(config_file),
            "PYTHONUNBUFFERED": "1",
            # Validation fetches (http-01) go straight to loopback, never a proxy.
            "NO_PROXY": "*",
            "no_proxy": "*",
        },
    )
    stack = Acme2CertifierStack(
        directory_url=f"https://127.0.0.1:{port}/directory",
        ca_bundle=ca_bundle,
        root_pem=root_pem,
        issuer_domain=issuer_domain,
        resolver_ip=resolver_ip,
        workdir=workdir,
        config_file=config_file,
        log=process.log,
        _process=process,
    )
    process.start()
    context = _ssl_context(ca_bundle)
    process.wait_ready(
        lambda: _answers(lambda: _request(stack.directory_url, context=context)), timeout
    )
    return stack


def _ssl_context(ca_bundle: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_bundle))


def _subdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _config(
    *,
    resolver_ip: str,
    issuer_domain: str,
    database: Path,
    issuing_cert: Path,
    issuing_key: Path,
    crl: Path,
    certs: Path,
    jit_validation: bool,
    debug: bool,
) -> str:
    """acme_srv.cfg (INI, no interpolation); lists are JSON, as a2c parses them."""
    return f"""\
# written by devstack.acme2certifier
[DEFAULT]
debug: {debug}
# Bare IPs; a2c asks port 53. (Only [DEFAULT] is read for it.)
dns_server_list: {json.dumps([resolver_ip])}

[Helper]
log_format: %(asctime)s %(levelname)s %(name)s: %(message)s

[Account]
# Let's Encrypt registers accounts without contact too.
contact_check_disable: True

[Directory]
# The issuer domain names of dns-persist-01 (and the directory's caaIdentities).
caaidentities: {json.dumps([issuer_domain])}

[DBhandler]
handler: wsgi
dbfile: {database}

[CAhandler]
handler_module: acme2certifier.cahandlers.openssl_ca_handler
issuing_ca_key: {issuing_key}
issuing_ca_cert: {issuing_cert}
# Required by the handler; written only on revocation.
issuing_ca_crl: {crl}
cert_save_path: {certs}
cert_validity_days: {_CERT_VALIDITY_DAYS}
# A CSR without a subject gets CN = its first name, as Let's Encrypt's leaves
# have (an empty subject would need a critical SAN: strict verifiers refuse it).
cn_enforce: True

[Challenge]
challenge_validation_timeout: {_VALIDATION_TIMEOUT_S}
http_01_support: True
dns_01_support: True
tls_alpn_01_support: False
dns_persist_01_support: True
dns_persist_allow_policy_wildcard: True
dns_persist_jit_validation: {jit_validation}

[Order]
tnauthlist_support: False
"""


def _write_issuing_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A root and an issuing CA below it, made now: (root cert, issuing cert, issuing key).

    Issued chains are leaf + issuing CA, as a public CA's are; the root stays out.
    """
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=365)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )

    def ca_cert(
        name: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: x509.Name,
        issuer_key: ec.EllipticCurvePrivateKey,
        path_length: int | None,
    ) -> x509.Certificate:
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                critical=False,
            )
            .sign(issuer_key, hashes.SHA256())
        )

    root_key = ec.generate_private_key(ec.SECP256R1())
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "certflow devstack a2c root")])
    root = ca_cert("certflow devstack a2c root", root_key, root_name, root_key, None)
    issuing_key = ec.generate_private_key(ec.SECP256R1())
    issuing = ca_cert("certflow devstack a2c issuing CA", issuing_key, root.subject, root_key, 0)

    pem = serialization.Encoding.PEM
    root_file, cert_file, key_file = (
        directory / "root.pem",
        directory / "issuing-ca.pem",
        directory / "issuing-ca-key.pem",
    )
    root_file.write_bytes(root.public_bytes(pem))
    cert_file.write_bytes(issuing.public_bytes(pem))
    key_file.unlink(missing_ok=True)
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        issuing_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return root_file, cert_file, key_file
