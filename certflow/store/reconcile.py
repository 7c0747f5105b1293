"""What reconcile reads: rows that should have a workflow and have none running;
rows inserted by SQL normalized or refused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from certflow.hostnames import Hostname


@dataclass(frozen=True)
class ReconcileRow:
    certificate_id: str
    hostname: str
    tenant_id: str | None
    created_at: datetime | None = None

async def rows_without_workflow(
    pool: asyncpg.Pool, after: tuple[datetime, str] | None, limit: int
) -> list[ReconcileRow]:
    """Rows that should have a workflow and never had one run (workflow_seen_at is
    written by a workflow's first step), oldest first, keyset-paged."""
    rows = await pool.fetch(
        """
        SELECT id::text AS certificate_id, hostname::text AS hostname, tenant_id, created_at
        FROM certificates
        WHERE workflow_seen_at IS NULL AND status <> 'CANCELED'
          AND ($1::timestamptz IS NULL OR (created_at, id::text) > ($1, $2))
        ORDER BY created_at, id::text
        LIMIT $3
        """,
        after[0] if after else None,
        after[1] if after else None,
        limit,
    )
    return [
        ReconcileRow(r["certificate_id"], r["hostname"], r["tenant_id"], r["created_at"])
        for r in rows
    ]

_GIVEN_UP = "(status = 'EXPIRED' AND provisioning_error IS NOT DISTINCT FROM 'DEPARTED')"
"""A row certflow stopped trying for (it left us and expired): no workflow until a new
request; CANCELED rows (ABANDONED among them) are left alone anyway."""

async def rows_to_restart(pool: asyncpg.Pool, hostnames: Sequence[str]) -> list[ReconcileRow]:
    """Of these hostnames (their workflows ended), the rows that should still have one."""
    rows = await pool.fetch(
        "SELECT id::text AS certificate_id, hostname::text AS hostname, tenant_id"
        " FROM certificates WHERE hostname = ANY($1::citext[]) AND status <> 'CANCELED'"
        f" AND NOT {_GIVEN_UP}",
        list(hostnames),
    )
    return [ReconcileRow(r["certificate_id"], r["hostname"], r["tenant_id"]) for r in rows]

async def all_open_rows(pool: asyncpg.Pool) -> list[ReconcileRow]:
    """Every row that should have a workflow (the full pass only)."""
    rows = await pool.fetch(
        "SELECT id::text AS certificate_id, hostname::text AS hostname, tenant_id"
        f" FROM certificates WHERE status <> 'CANCELED' AND NOT {_GIVEN_UP} ORDER BY created_at"
    )
    return [ReconcileRow(r["certificate_id"], r["hostname"], r["tenant_id"]) for r in rows]

async def rename(pool: asyncpg.Pool, certificate_id: str, hostname: Hostname) -> bool:
    """Give a row its normalized hostname; False when another row already has it."""
    try:
        result = await pool.fetchval(
            "UPDATE certificates SET hostname = $2, updated_at = now()"
            " WHERE id = $1::uuid RETURNING true",
            certificate_id,
            hostname,
        )
    except asyncpg.UniqueViolationError:
        return False
    return bool(result)

async def refuse_hostname(pool: asyncpg.Pool, certificate_id: str, reason: str) -> None:
    """CANCELED with INVALID_HOSTNAME and the reason: never started, and said so."""
    await pool.execute(
        """
        UPDATE certificates SET status = 'CANCELED', provisioning_error = 'INVALID_HOSTNAME',
            provisioning_error_message = $2, updated_at = now()
        WHERE id = $1::uuid AND status <> 'CANCELED'
        """,
        certificate_id,
        reason[:2000],
    )
