"""certflow's client: a CLI for operators and product backends, and a small async API.

    python starter.py request HOST... [--tenant T] [--wait SECONDS]
    python starter.py status HOST [--json]
    python starter.py list [--status S] [--json]
    python starter.py events HOST [--json]
    python starter.py retry HOST | renew HOST | cancel HOST | delete HOST [--revoke]
    python starter.py cooldown [--clear]
    python starter.py rotate-keys
    python starter.py reconcile [--install [--every SECONDS]]
    python starter.py migrate
    python starter.py demo [--exit]

``CertflowClient`` is the same thing as a library: it validates hostnames,
upserts the certificate rows and starts (or finds) one workflow per hostname.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from certflow import certificates, cooldown
from certflow.cooldown import Cooldown
from certflow.db import create_pool, migrate
from certflow.errors import ConfigError
from certflow.hostnames import InvalidHostnameError, normalize_hostname
from certflow.models import (
    WORKFLOW_TYPE,
    CertificateInput,
    CertificateState,
    CertificateStatus,
    DeleteRequest,
    ReconcileResult,
    workflow_id_for,
)
from certflow.schedules import (
    RECONCILE_WORKFLOW_TYPE,
    install_reconcile_schedule,
    reconcile_schedule_id,
)
from certflow.crypto import DecryptionError, EncryptionKey
from certflow.rotation import rotate_keys
from certflow.settings import ClientSettings, KeySettings, load_settings


@dataclass
class CertificateStatusReport:
    """What ``status`` shows: the row (system of record) plus the workflow's view."""

    hostname: str
    status: str
    error_code: str | None
    error_message: str | None
    retry_count: int
    expires_at: datetime | None
    serial: str | None
    workflow_id: str
    phase: str | None = None
    next_attempt_at: datetime | None = None
    cooldown_until: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            key: value.isoformat() if isinstance(value, datetime) else value
            for key, value in self.__dict__.items()
        }


START_CONCURRENCY = 16


class ActionRejectedError(Exception):
    """The workflow refused an action (nothing to retry, not ACTIVE, …) or has none to take it."""


def _rejection(err: WorkflowUpdateFailedError) -> str:
    cause = err.cause
    return str(getattr(cause, "message", None) or cause or err)


class CertflowClient:
    """Request certificates and read their status."""

    def __init__(self, pool: asyncpg.Pool, temporal: Client, task_queue: str) -> None:
        self.pool = pool
        self.temporal = temporal
        self.task_queue = task_queue

    @classmethod
    async def connect(cls, settings: ClientSettings) -> CertflowClient:
        pool = await create_pool(settings.database_url, max_size=4)
        temporal = await Client.connect(
            settings.temporal_address,
            namespace=settings.temporal_namespace,
            data_converter=pydantic_data_converter,
        )
        return cls(pool, temporal, settings.task_queue)

    async def close(self) -> None:
        await self.pool.close()

    async def request(
        self, hostnames: Sequence[str], tenant_id: str | None = None
    ) -> list[str]:
        """Validate every hostname first (one bad name writes nothing), then upsert
        each row and start its workflow, or find the one already running."""
        unique = list(dict.fromkeys(normalize_hostname(h) for h in hostnames))
        await certificates.request_certificates(self.pool, unique, tenant_id)
        # Starts are independent round trips to Temporal: a few at a time.
        slots = asyncio.Semaphore(START_CONCURRENCY)

        async def start(hostname: str) -> None:
            async with slots:
                await self.temporal.start_workflow(
                    WORKFLOW_TYPE,
                    CertificateInput(hostname=hostname, tenant_id=tenant_id),
                    id=workflow_id_for(hostname),
                    task_queue=self.task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                )

        await asyncio.gather(*(start(h) for h in unique))
        return unique

    def handle(self, hostname: str) -> WorkflowHandle[Any, Any]:
        return self.temporal.get_workflow_handle(workflow_id_for(hostname))

    async def status(self, hostname: str) -> CertificateStatusReport | None:
        hostname = normalize_hostname(hostname)
        row = await certificates.certificate_summary(self.pool, hostname)
        if row is None:
            return None
        report = CertificateStatusReport(
            hostname=row["hostname"],
            status=row["status"],
            error_code=row["error_code"],
            error_message=row["error_message"],
            retry_count=row["retry_count"],
            expires_at=row["expires_at"],
            serial=row["serial"],
            workflow_id=workflow_id_for(hostname),
        )
        if report.status != CertificateStatus.ACTIVE:
            in_force = await cooldown.active_cooldowns(self.pool)
            if in_force:
                report.cooldown_until = max(c.until for c in in_force)
        try:
            state = await self.handle(hostname).query("status", result_type=CertificateState)
        except RPCError:
            return report  # no workflow (or none running): the row says it all
        report.phase = state.phase
        report.next_attempt_at = state.next_attempt_at
        return report

    async def list_certificates(self, status: str | None = None) -> list[dict[str, Any]]:
        """Certificates from Postgres, optionally of one status."""
        return await certificates.list_certificates(self.pool, status)

    async def events(self, hostname: str) -> list[dict[str, Any]]:
        """The certificate's transitions, oldest first."""
        return await certificates.events(self.pool, normalize_hostname(hostname))

    async def retry(self, hostname: str) -> CertificateState:
        """Retry now (the ``retry`` update): rejected when there is nothing to retry."""
        return await self._update(hostname, "retry")

    async def renew(self, hostname: str) -> CertificateState:
        """Renew an ACTIVE certificate now (the ``renew`` update)."""
        return await self._update(hostname, "renew")

    async def cancel(self, hostname: str) -> CertificateState:
        """Stop provisioning and renewal: CANCELED, the open authorization deactivated."""
        return await self._update_with_start(hostname, "cancel", None)

    async def delete(self, hostname: str, *, revoke: bool = False) -> CertificateState:
        """Cancel, optionally revoke the current certificate, and remove the rows."""
        return await self._update_with_start(hostname, "delete", DeleteRequest(revoke=revoke))

    async def cooldowns(self) -> list[Cooldown]:
        """Rate-limit cooldowns in force (one per CA directory)."""
        return await cooldown.active_cooldowns(self.pool)

    async def clear_cooldowns(self) -> list[str]:
        """End every cooldown now (after the CA lifted a limit) and wake the workflows
        that were waiting for it; returns their hostnames."""
        await cooldown.clear_all(self.pool)
        waiting = await certificates.waiting_for_cooldown(self.pool)
        for hostname in waiting:
            with contextlib.suppress(RPCError):
                await self.handle(hostname).signal("retry")
        return waiting

    async def install_reconcile(self, every_seconds: float) -> None:
        await install_reconcile_schedule(self.temporal, self.task_queue, every_seconds)

    async def reconcile_now(self) -> ReconcileResult:
        """One reconcile pass, run by a worker, waited for."""
        result: ReconcileResult = await self.temporal.execute_workflow(
            RECONCILE_WORKFLOW_TYPE,
            id=f"{reconcile_schedule_id(self.task_queue)}:manual-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
            result_type=ReconcileResult,
        )
        return result

    async def _update(self, hostname: str, update: str) -> CertificateState:
        hostname = normalize_hostname(hostname)
        try:
            state: CertificateState = await self.handle(hostname).execute_update(
                update, result_type=CertificateState
            )
        except WorkflowUpdateFailedError as err:
            raise ActionRejectedError(_rejection(err)) from None
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                raise ActionRejectedError(
                    f"{hostname} has no running workflow (request it first)"
                ) from None
            raise
        return state

    async def _update_with_start(
        self, hostname: str, update: str, arg: DeleteRequest | None
    ) -> CertificateState:
        """Deliver the update, starting the workflow first if none runs (so a worker,
        which holds the ACME account, carries it out)."""
        hostname = normalize_hostname(hostname)
        row = await certificates.certificate_summary(self.pool, hostname)
        if row is None:
            raise ActionRejectedError(f"no certificate for {hostname}")
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            WORKFLOW_TYPE,
            CertificateInput(hostname=hostname, tenant_id=row["tenant_id"]),
            id=workflow_id_for(hostname),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            state: CertificateState = await self.temporal.execute_update_with_start_workflow(
                update,
                arg,
                start_workflow_operation=start,
                result_type=CertificateState,
            )
        except WorkflowUpdateFailedError as err:
            raise ActionRejectedError(_rejection(err)) from None
        return state

    async def wait(
        self, hostnames: Sequence[str], timeout: float, poll_interval: float = 0.2
    ) -> dict[str, CertificateStatusReport | None]:
        """Wait until each hostname is ACTIVE or carries an error code (or timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            reports = {h: await self.status(h) for h in hostnames}
            settled = all(
                r is not None and (r.status == CertificateStatus.ACTIVE or r.error_code)
                for r in reports.values()
            )
            if settled or time.monotonic() >= deadline:
                return reports
            await asyncio.sleep(poll_interval)


def _print_table(reports: Sequence[CertificateStatusReport | None], hostnames: Sequence[str]) -> None:
    rows = [("HOSTNAME", "STATUS", "EXPIRES", "ERROR")]
    for hostname, r in zip(hostnames, reports):
        if r is None:
            rows.append((hostname, "UNKNOWN", "", ""))
        else:
            expires = r.expires_at.strftime("%Y-%m-%d %H:%M UTC") if r.expires_at else ""
            error = f"{r.error_code}: {r.error_message}" if r.error_code else ""
            rows.append((r.hostname, r.status, expires, error))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(col.ljust(w) for col, w in zip(row, widths)) + "  " + row[3])


async def _cli(args: argparse.Namespace) -> int:
    # Bad hostnames are refused before anything connects anywhere.
    for hostname in [*getattr(args, "hostnames", []), getattr(args, "hostname", None)]:
        if hostname is not None:
            normalize_hostname(hostname)
    settings = load_settings(ClientSettings)
    if args.command == "migrate":
        pool = await create_pool(settings.database_url, max_size=1)
        try:
            applied = await migrate(pool)
        finally:
            await pool.close()
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
        return 0
    if args.command == "rotate-keys":
        return await _rotate_keys()
    client = await CertflowClient.connect(settings)
    try:
        if args.command == "request":
            hostnames = await client.request(args.hostnames, tenant_id=args.tenant)
            for hostname in hostnames:
                print(f"requested {hostname} (workflow {workflow_id_for(hostname)})")
            if args.wait is None:
                return 0
            reports = await client.wait(hostnames, args.wait)
            _print_table(list(reports.values()), hostnames)
            return 0 if all(r and r.status == "ACTIVE" for r in reports.values()) else 1
        if args.command in ("retry", "renew", "cancel"):
            state = await getattr(client, args.command)(args.hostname)
            print(f"{state.hostname}: {state.status} ({state.phase})")
            return 0
        if args.command == "delete":
            state = await client.delete(args.hostname, revoke=args.revoke)
            print(f"{state.hostname}: {state.phase}")
            if state.error_message:
                print(f"certflow: {state.error_message}", file=sys.stderr)
            return 0 if state.phase == "deleted" else 1
        if args.command == "events":
            rows = await client.events(args.hostname)
            if args.json:
                print(json.dumps(rows, indent=2, default=str))
            for row in [] if args.json else rows:
                change = f"{row['from_status'] or '-'} → {row['to_status']}"
                code = f" {row['error_code']}" if row["error_code"] else ""
                print(f"{row['at']:%Y-%m-%d %H:%M:%S}  {change}{code}  {row['message'] or ''}")
            return 0
        if args.command == "list":
            rows = await client.list_certificates(args.status)
            if args.json:
                print(json.dumps(rows, indent=2, default=str))
            else:
                for row in rows:
                    expires = row["expires_at"].strftime("%Y-%m-%d") if row["expires_at"] else "-"
                    print(f"{row['hostname']}  {row['status']}  {expires}  {row['error_code'] or ''}")
            return 0
        if args.command == "cooldown":
            if args.clear:
                woken = await client.clear_cooldowns()
                print(f"cooldown cleared; woke {len(woken)} waiting workflow(s)")
                return 0
            in_force = await client.cooldowns()
            if not in_force:
                print("no cooldown in force")
            for c in in_force:
                print(f"{c.directory_url}: until {c.until.isoformat()} ({c.problem_type or ''} {c.detail or ''})")
            return 0
        if args.command == "reconcile":
            if args.install:
                await client.install_reconcile(args.every)
                print(f"reconcile schedule installed: every {args.every:g} s")
                return 0
            result = await client.reconcile_now()
            print(f"checked {result.checked} certificates; started {len(result.started)} workflows")
            for hostname in result.started:
                print(f"  started {hostname}")
            return 0
        if args.command == "status":
            report = await client.status(args.hostname)
            if report is None:
                print(f"certflow: no certificate for {args.hostname}", file=sys.stderr)
                return 1
            if args.json:
                print(json.dumps(report.to_json(), indent=2))
            else:
                _print_table([report], [report.hostname])
                if report.phase:
                    print(f"phase: {report.phase}")
            return 0
    finally:
        await client.close()
    raise AssertionError(args.command)


async def _rotate_keys() -> int:
    """Re-encrypt stored keys under CERTFLOW_ENCRYPTION_KEY (old ones in _KEYS_OLD)."""
    settings = load_settings(KeySettings)
    key = EncryptionKey(settings.encryption_key_bytes, settings.old_encryption_keys_bytes)
    pool = await create_pool(settings.database_url, max_size=2)
    try:
        report = await rotate_keys(pool, key)
    except DecryptionError as err:
        print(f"certflow: {err}; nothing after that value was changed", file=sys.stderr)
        return 1
    finally:
        await pool.close()
    print(f"examined {report.examined} rows; re-encrypted {report.reencrypted} values")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="starter.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    request = sub.add_parser("request", help="request certificates for hostnames")
    request.add_argument("hostnames", nargs="+", metavar="HOST")
    request.add_argument("--tenant", help="opaque tenant id stored with the row")
    request.add_argument(
        "--wait", type=float, metavar="SECONDS", help="wait until ACTIVE or an error; exit 0 only if all ACTIVE"
    )
    status = sub.add_parser("status", help="show a certificate's status")
    status.add_argument("hostname", metavar="HOST")
    status.add_argument("--json", action="store_true")
    for action, text in (
        ("retry", "retry now (DNS fixed, or a FAILED certificate)"),
        ("renew", "renew an ACTIVE certificate now"),
        ("cancel", "stop provisioning and renewal (status CANCELED)"),
    ):
        sub.add_parser(action, help=text).add_argument("hostname", metavar="HOST")
    delete = sub.add_parser("delete", help="cancel and remove the certificate's rows")
    delete.add_argument("hostname", metavar="HOST")
    delete.add_argument("--revoke", action="store_true", help="revoke the current certificate first")
    events = sub.add_parser("events", help="a certificate's transitions")
    events.add_argument("hostname", metavar="HOST")
    events.add_argument("--json", action="store_true")
    listing = sub.add_parser("list", help="list certificates")
    listing.add_argument("--status", type=str.upper, choices=[s.value for s in CertificateStatus])
    listing.add_argument("--json", action="store_true")
    cooldown_cmd = sub.add_parser("cooldown", help="show (or clear) the CA rate-limit cooldown")
    cooldown_cmd.add_argument("--clear", action="store_true")
    reconcile = sub.add_parser("reconcile", help="start missing workflows now, or install the schedule")
    reconcile.add_argument("--install", action="store_true")
    reconcile.add_argument("--every", type=float, default=300.0, metavar="SECONDS")
    sub.add_parser(
        "rotate-keys", help="re-encrypt stored keys with CERTFLOW_ENCRYPTION_KEY (workers keep running)"
    )
    sub.add_parser("migrate", help="apply database migrations")
    demo = sub.add_parser("demo", help="run everything locally and issue three demo certificates")
    demo.add_argument("--exit", action="store_true", help="stop after printing the table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        try:
            from certflow.dev.demo import run_demo
        except ImportError:
            print(
                "certflow: the demo runs from a checkout with the dev extra"
                " (scripts/setup.sh && .venv/bin/python starter.py demo)",
                file=sys.stderr,
            )
            return 2
        return run_demo(keep_running=not args.exit)
    try:
        return asyncio.run(_cli(args))
    except ConfigError as err:
        print(f"certflow: configuration error: {err}", file=sys.stderr)
        return 2
    except InvalidHostnameError as err:
        print(f"certflow: {err}", file=sys.stderr)
        return 2
    except ActionRejectedError as err:
        print(f"certflow: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
