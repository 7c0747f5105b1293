"""The command line's commands: one function per command, one dispatch table, and
``run``, which runs one with the exit codes certflow/product/cli.py documents.

Imported by certflow/product/cli.py only after the arguments were validated, so that a
bad hostname is refused before any of this (the Temporal client, pydantic
models, Postgres) is even imported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel

from certflow.product.client import CertflowClient
from certflow.connect.connections import open_postgres
from certflow.contract import workflow_id_for
from certflow.crypto import DecryptionError, EncryptionKey
from certflow.errors import ConfigError, ServiceUnreachableError, ActionRejectedError
from certflow.hostnames import InvalidHostnameError, InvalidTenantError, parse_host_port
from certflow.models import CertificateStatus, LimitScope, MethodReadiness, Phase, RequestedMethod
from certflow.workflow_payloads import CertificateState
from certflow.edge.probe import edge_serving
from certflow.edge.responder import bind_listener
from certflow.connect.payload_codec import PayloadKeyError
from certflow.connect.settings import ClientSettings, CodecServerSettings, KeySettings, load_settings
from certflow.store.db import migrate
from certflow.store.rotation import rotate_keys
from certflow.product.tables import print_table

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(_jsonable(value), indent=2, default=str))


@asynccontextmanager
async def _client() -> AsyncIterator[CertflowClient]:
    client = await CertflowClient.connect(load_settings(ClientSettings))
    try:
        yield client
    finally:
        await client.close()


# -- the commands ------------------------------------------------------------------


async def request(args: argparse.Namespace) -> int:
    async with _client() as client:
        hostnames = await client.request(
            args.hostnames,
            tenant_id=args.tenant,
            method=None if args.method is None else RequestedMethod(args.method),
        )
        reports = await client.wait(hostnames, args.wait) if args.wait is not None else None
    if args.json:
        _print_json(
            {
                "requested": [
                    {
                        "hostname": h,
                        "workflow_id": workflow_id_for(h),
                        "ownership": _dump(client.ownership_record(h, args.tenant)),
                    }
                    for h in hostnames
                ],
                "status": list(reports.values()) if reports is not None else None,
            }
        )
    else:
        for hostname in hostnames:
            print(f"requested {hostname} (workflow {workflow_id_for(hostname)})")
            proof = client.ownership_record(hostname, args.tenant)
            if proof is not None:
                print(f"  to prove ownership: {proof.name} TXT \"{proof.value}\"")
        if reports is not None:
            print_table(list(reports.values()), hostnames)
    if reports is None:
        return 0
    return 0 if all(r and r.status is CertificateStatus.ACTIVE for r in reports.values()) else 1


async def check(args: argparse.Namespace) -> int:
    async with _client() as client:
        reports = await client.check(args.hostnames, tenant_id=args.tenant)
    if args.json:
        _print_json([{**r.model_dump(mode="json"), "ok": r.ok} for r in reports])
    for report in [] if args.json else reports:
        print(f"{report.hostname}: {'ok' if report.ok else 'NOT READY'}")
        for c in report.checks:
            print(f"  {c.name:<7} {'ok  ' if c.ok else 'FAIL'} {c.message}")
        _print_methods(report.methods)
    return 0 if all(r.ok for r in reports) else 1


def _print_methods(methods: Sequence[MethodReadiness]) -> None:
    for m in methods:
        print(f"  method {m.method:<15} {'ready' if m.ready else 'not ready'}: {m.detail}")
        if m.record is not None and not m.ready:
            print(f"    add: {m.record.name} {m.record.type} {m.record.value}")
        if m.caa is not None:
            print(f"    CAA {'allows' if m.caa_allowed else 'refuses' if m.caa_allowed is False else '?'}: {m.caa}")


async def transfer(args: argparse.Namespace) -> int:
    async with _client() as client:
        state = await client.transfer(args.hostname, args.to)
    if args.json:
        _print_json(state)
    else:
        print(f"{args.hostname} belongs to {args.to} now; {state.status} ({state.phase})")
    return 0


def _dump(value: Any) -> Any:
    return None if value is None else value.model_dump(mode="json")


async def status(args: argparse.Namespace) -> int:
    async with _client() as client:
        report = await client.status(args.hostname, methods=True)
        serving = [] if report is None or args.json else await edge_serving(client.pool, args.hostname)
    if report is None:
        print(f"certflow: no certificate for {args.hostname}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(report)
    else:
        print_table([report], [report.hostname])
        if report.phase:
            print(f"phase: {report.phase}")
        if report.issuer or report.order_issuer:
            attempt = report.order_issuer if report.order_issuer != report.issuer else None
            print(f"issuer: {report.issuer or '-'}" + (f" (attempt at {attempt})" if attempt else ""))
        _print_methods(report.methods or [])
        for edge in serving:
            print(edge.describe(report.serial))
    return 0


async def list_(args: argparse.Namespace) -> int:
    async with _client() as client:
        rows = await client.list_certificates(args.status)
    if args.json:
        _print_json(rows)
    for row in [] if args.json else rows:
        expires = row.expires_at.strftime("%Y-%m-%d") if row.expires_at else "-"
        print(f"{row.hostname}  {row.status}  {expires}  {row.error_code or ''}")
    return 0


async def events(args: argparse.Namespace) -> int:
    async with _client() as client:
        rows = await client.events(args.hostname)
    if args.json:
        _print_json(rows)
    for row in [] if args.json else rows:
        change = f"{row.from_status or '-'} → {row.to_status}"
        code = f" {row.error_code}" if row.error_code else ""
        print(f"{row.at:%Y-%m-%d %H:%M:%S}  {change}{code}  {row.message or ''}")
    return 0


def _action(name: str) -> Command:
    async def act(args: argparse.Namespace) -> int:
        async with _client() as client:
            state: CertificateState = await getattr(client, name)(args.hostname)
        if args.json:
            _print_json(state)
        else:
            print(f"{state.hostname}: {state.status} ({state.phase})")
        return 0

    act.__name__ = name
    return act


async def delete(args: argparse.Namespace) -> int:
    async with _client() as client:
        state = await client.delete(args.hostname, revoke=args.revoke)
    if args.json:
        _print_json(state)
    else:
        print(f"{state.hostname}: {state.phase}")
    if state.error_message:
        print(f"certflow: {state.error_message}", file=sys.stderr)
    return 0 if state.phase is Phase.DELETED else 1


async def cooldown(args: argparse.Namespace) -> int:
    if not args.clear and (args.scope or args.key):
        print("certflow: --scope and --key go with --clear", file=sys.stderr)
        return 2
    async with _client() as client:
        if args.clear:
            woken = await client.clear_cooldowns(args.scope, args.key)
            if args.json:
                _print_json({"cleared": True, "woken": woken})
            else:
                print(f"cooldown cleared; woke {len(woken)} waiting workflow(s)")
            return 0
        in_force = await client.cooldowns()
    if args.json:
        _print_json(in_force)
        return 0
    if not in_force:
        print("no cooldown in force")
    for c in in_force:
        where = "account" if c.scope is LimitScope.ACCOUNT else f"{c.scope} {c.scope_key}"
        print(f"{where}: {c.limit_name} until {c.until.isoformat()} ({c.directory_url}) {c.detail or ''}")
    return 0


async def reconcile(args: argparse.Namespace) -> int:
    async with _client() as client:
        if args.install:
            await client.install_reconcile(args.every)
            if args.json:
                _print_json({"installed": True, "every_seconds": args.every})
            else:
                print(f"reconcile schedule installed: every {args.every:g} s")
            return 0
        result = await client.reconcile_now(full=args.full)
    if args.json:
        _print_json(result)
        return 0
    print(f"checked {result.checked} certificates; started {result.total_started} workflows")
    for hostname in result.started:
        print(f"  started {hostname}")
    if result.total_started > len(result.started):
        print(f"  … and {result.total_started - len(result.started)} more")
    for hostname in result.refused:
        print(f"  refused {hostname!r}: not a valid hostname (CANCELED, INVALID_HOSTNAME)")
    if result.total_refused > len(result.refused):
        print(f"  … and {result.total_refused - len(result.refused)} more refused")
    return 0


async def rotate_keys_(args: argparse.Namespace) -> int:
    """Re-encrypt stored keys under CERTFLOW_ENCRYPTION_KEY (old ones in _KEYS_OLD)."""
    settings = load_settings(KeySettings)
    key = EncryptionKey(settings.encryption_key_bytes, settings.old_encryption_keys_bytes)
    pool = await open_postgres(settings.database_url, max_size=2)
    try:
        report = await rotate_keys(pool, key)
    except DecryptionError as err:
        print(f"certflow: {err}; nothing after that value was changed", file=sys.stderr)
        return 1
    finally:
        await pool.close()
    if args.json:
        _print_json(report.__dict__)
    else:
        print(f"examined {report.examined} rows; re-encrypted {report.reencrypted} values")
    return 0


async def migrate_(args: argparse.Namespace) -> int:
    pool = await open_postgres(load_settings(ClientSettings).database_url, max_size=1)
    try:
        applied = await migrate(pool)
    finally:
        await pool.close()
    if args.json:
        _print_json({"applied": applied})
    else:
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


async def codec_server_(args: argparse.Namespace) -> int:
    """Serve Temporal's /decode and /encode until SIGINT or SIGTERM."""
    from certflow.product.codec_server import codec_server

    overrides = {"codec_listen": args.listen} if args.listen else {}
    settings = load_settings(CodecServerSettings, **overrides)
    server = codec_server(settings)
    host, port = parse_host_port(settings.codec_listen)
    try:
        listener = bind_listener(host, port)
    except OSError as err:
        raise ConfigError(f"CERTFLOW_CODEC_LISTEN: cannot listen on {settings.codec_listen}: {err.strerror}") from None
    scheme = "https" if settings.codec_tls_cert else "http"
    print(f"codec server on {scheme}://{settings.codec_listen} (POST /decode, /encode)", flush=True)
    await server.serve(sockets=[listener])
    return 0


async def edge_(args: argparse.Namespace) -> int:
    """Keep an edge holding exactly the current certificates, until SIGTERM or SIGINT."""
    from certflow.edge.process import run_edge
    from certflow.running.logs import configure_logging
    from certflow.edge.settings import EdgeSettings

    overrides = {
        "edge_kind": args.kind, "edge_dir": args.dir, "edge_owner": args.owner,
        "edge_haproxy_socket": args.socket, "edge_haproxy_crt_list": args.crt_list,
        "edge_listen": args.listen,
    }
    settings = load_settings(EdgeSettings, **{k: v for k, v in overrides.items() if v is not None})
    configure_logging()  # JSON lines, as the worker's (certflow/running/logs.py keeps key material out)
    return await run_edge(settings)


async def migrate_runs(args: argparse.Namespace) -> int:
    """Every running Certificate workflow of the task queue brought to the current
    design, or with ``--check`` counted by design (certflow/product/runs.py)."""
    from certflow.product.runs import check_designs, signal_migrate

    async with _client() as client:
        return await (check_designs(client) if args.check else signal_migrate(client))


COMMANDS: dict[str, Command] = {
    "request": request,
    "check": check,
    "status": status,
    "list": list_,
    "events": events,
    "retry": _action("retry"),
    "renew": _action("renew"),
    "transfer": transfer,
    "cancel": _action("cancel"),
    "delete": delete,
    "cooldown": cooldown,
    "reconcile": reconcile,
    "migrate-runs": migrate_runs,
    "rotate-keys": rotate_keys_,
    "migrate": migrate_,
    "codec-server": codec_server_,
    "edge": edge_,
}


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; print one line on stderr and return the exit code
    for what it refuses."""
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except (ConfigError, InvalidHostnameError, InvalidTenantError) as err:
        prefix = "configuration error: " if isinstance(err, ConfigError) else ""
        print(f"certflow: {prefix}{err}", file=sys.stderr)
        return 2
    except (ServiceUnreachableError, PayloadKeyError) as err:
        print(f"certflow: {err}", file=sys.stderr)
        return 2
    except ActionRejectedError as err:
        print(f"certflow: {err}", file=sys.stderr)
        return 1
