"""The ``starter.py`` command line (installed as ``certflow``): parsing, and the
checks that need nothing but the arguments; the commands are in
certflow/product/commands.py.

Every command prints plain lines, or with ``--json`` one JSON document; exit 0
on success, 1 when the request was refused or not met, 2 for bad input or
settings (one line on stderr, before anything connects anywhere) and for a
Postgres or Temporal it cannot reach (one line naming the address and the
setting, within certflow.connect.connections' bound).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from certflow.hostnames import (
    InvalidHostnameError,
    InvalidTenantError,
    normalize_hostname,
    normalize_tenant_id,
)
from certflow.models import CertificateStatus, RequestedMethod



def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="starter.py", description="certflow: ACME certificates for customer hostnames"
    )
    sub = root.add_subparsers(dest="command", required=True)

    def command(name: str, text: str, *, host: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text)
        if host:
            p.add_argument("hostname", metavar="HOST")
        p.add_argument("--json", action="store_true", help="print one JSON document")
        return p

    p = command("request", "request certificates for hostnames")
    p.add_argument("hostnames", nargs="+", metavar="HOST")
    p.add_argument("--tenant", help="opaque tenant id stored with the row")
    p.add_argument(
        "--method",
        choices=[m.value for m in RequestedMethod],
        help="how the CA is shown control: auto (default: the first ready at each attempt),"
        " http-01 (routed to the edge), dns-01 (delegated _acme-challenge CNAME),"
        " dns-persist-01 (a _validation-persist TXT naming our account)",
    )
    p.add_argument(
        "--wait", type=float, metavar="SECONDS",
        help="wait until ACTIVE or an error; exit 0 only if all ACTIVE",
    )
    p = command(
        "check",
        "run every pre-check of hostnames (each validation method, CAA), ordering nothing",
    )
    p.add_argument("hostnames", nargs="+", metavar="HOST")
    p.add_argument("--tenant", help="also check this tenant's proof of ownership")
    p = command("transfer", "move a hostname to another tenant (who must prove ownership)", host=True)
    p.add_argument("--to", required=True, metavar="TENANT", help="the tenant to move it to")
    command("status", "show a certificate's status", host=True)
    p = command("list", "list certificates")
    p.add_argument("--status", type=str.upper, choices=[s.value for s in CertificateStatus])
    command("events", "a certificate's transitions", host=True)
    command("retry", "retry now (DNS fixed, or a FAILED certificate)", host=True)
    command("renew", "renew an ACTIVE certificate now", host=True)
    command("cancel", "stop provisioning and renewal (status CANCELED)", host=True)
    p = command("delete", "cancel and remove the certificate's rows", host=True)
    p.add_argument("--revoke", action="store_true", help="revoke the current certificate first")
    p = command("cooldown", "show (or clear) the CA rate-limit cooldowns")
    p.add_argument("--clear", action="store_true")
    p.add_argument("--scope", help="with --clear: only this scope (account, registered_domain, hostname)")
    p.add_argument("--key", help="with --clear --scope: only this registered domain or hostname")
    p = command("reconcile", "start missing workflows now, or install the schedule")
    p.add_argument("--install", action="store_true")
    p.add_argument(
        "--every", type=float, default=900.0, metavar="SECONDS",
        help="the interval (default 900, as the worker's CERTFLOW_RECONCILE_INTERVAL_SECONDS)",
    )
    p.add_argument("--full", action="store_true", help="also compare every row with every running workflow")
    command("rotate-keys", "re-encrypt stored keys with CERTFLOW_ENCRYPTION_KEY (workers keep running)")
    command("migrate", "apply database migrations")
    p = command(
        "migrate-runs",
        "bring every running certificate workflow to the current design (docs/changing-the-workflow.md)",
    )
    p.add_argument(
        "--check", action="store_true",
        help="signal nothing: count the runs by design (a status query each); exit 1 while any is older",
    )
    p = command(
        "codec-server",
        "decode encrypted payloads for the Temporal Web UI and CLI (operators only; runs until stopped)",
    )
    p.add_argument("--listen", metavar="HOST:PORT", help="overrides CERTFLOW_CODEC_LISTEN")
    _edge_arguments(command("edge", "keep an edge holding exactly the current certificates (runs until stopped)"))
    return root


def _edge_arguments(p: argparse.ArgumentParser) -> None:
    """``edge``'s flags: each overrides its CERTFLOW_EDGE_* setting."""
    p.add_argument(
        "--kind", choices=["files", "haproxy", "caddy"],
        help="overrides CERTFLOW_EDGE_KIND (files: nginx and edges that read files)",
    )
    p.add_argument("--dir", metavar="DIR", help="the files kind's directory; overrides CERTFLOW_EDGE_DIR")
    p.add_argument(
        "--owner", metavar="USER", help="who owns the files (nginx's worker user); overrides CERTFLOW_EDGE_OWNER"
    )
    p.add_argument(
        "--socket", metavar="PATH|HOST:PORT",
        help="HAProxy's runtime API (level admin); overrides CERTFLOW_EDGE_HAPROXY_SOCKET",
    )
    p.add_argument(
        "--crt-list", metavar="PATH",
        help="the crt-list on HAProxy's bind line; overrides CERTFLOW_EDGE_HAPROXY_CRT_LIST",
    )
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="where the caddy kind answers Caddy; overrides CERTFLOW_EDGE_LISTEN"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, refuse bad hostnames and tenant ids, then run the command with them
    validated (the client takes them as they are)."""
    args = parser().parse_args(argv)
    try:
        if getattr(args, "hostnames", None):
            args.hostnames = [normalize_hostname(h) for h in args.hostnames]
        if getattr(args, "hostname", None) is not None:
            args.hostname = normalize_hostname(args.hostname)
        for tenant in ("tenant", "to"):
            if getattr(args, tenant, None) is not None:
                setattr(args, tenant, normalize_tenant_id(getattr(args, tenant)))
    except (InvalidHostnameError, InvalidTenantError) as err:
        print(f"certflow: {err}", file=sys.stderr)
        return 2
    # Imported only now: a bad hostname is refused in a third of the time, before
    # the Temporal client is even loaded.
    from certflow.product.commands import run

    return run(args)


def exit_process(code: int) -> NoReturn:
    """End the command's process with ``code``, output flushed, without the
    interpreter's teardown: the Temporal client's Rust threads can abort a
    finalizing interpreter ("PyGILState_Release: thread state … must be current",
    temporalio/sdk-python#300), turning a command that succeeded into exit -6."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def entry_point() -> NoReturn:
    """The installed ``certflow`` command."""
    exit_process(main())
