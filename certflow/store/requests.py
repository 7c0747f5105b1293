"""The product's side of the rows: requests (one tenant per hostname), transfers,
what a client reads (state, lists, events)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from certflow.hostnames import Hostname
from certflow.models import CertificateEvent, CertificateRecord, RequestedMethod
from certflow.workflow_payloads import CertificateState
from certflow.store.certificates import RECORD_COLUMNS, record_columns, record_of


OWNED_ELSEWHERE = "refused: requested by another tenant"
"""The message of the event a refused request leaves on the hostname's row."""


async def transfer(
    pool: asyncpg.Pool, certificate_id: str, to_tenant: str
) -> tuple[str | None, CertificateRecord] | None:
    """Move the row to ``to_tenant`` (the one change of tenant the row's trigger
    lets through) and record the event; (the tenant it had, the row), or None when
    the row is gone. The ownership proof is the caller's to check first."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL certflow.tenant_transfer = 'on'")
        before = await conn.fetchval(
            "SELECT tenant_id FROM certificates WHERE id = $1::uuid FOR UPDATE", certificate_id
        )
        row = await conn.fetchrow(
            f"""
            UPDATE certificates AS c SET tenant_id = $3, updated_at = now()
            WHERE id = $1::uuid
            RETURNING {RECORD_COLUMNS}
            """,
            certificate_id,
            None,
            to_tenant,
        )
        if row is None:
            return None
        await conn.execute(
            """
            INSERT INTO certificate_events (certificate_id, hostname, from_status, to_status, message)
            SELECT id, hostname, status, status, $2 FROM certificates WHERE id = $1::uuid
            """,
            certificate_id,
            f"transferred to tenant {to_tenant}" + (f" from {before}" if before else ""),
        )
    return before, record_of(row)


@dataclass(frozen=True)
class Requested:
    """What a request did: the hostnames refused, and each row it wrote as it left
    it (``skips_dns`` not read: False), by hostname."""

    refused: list[str]
    rows: dict[str, CertificateRecord]


async def request_certificates(
    pool: asyncpg.Pool,
    hostnames: Sequence[Hostname],
    tenant_id: str | None,
    method: RequestedMethod | None = None,
) -> Requested:
    """Upsert the rows a product asks for, in one statement; a canceled one is
    requested again. A hostname of another tenant is refused: then nothing is
    written but an event on each such row, and their names are returned. A request
    without a tenant keeps the row's; a row without one takes the requester's. A
    request without a method keeps the row's (``auto`` for a new row)."""
    found = await pool.fetch(
        f"""
        WITH owned AS (
            SELECT id, hostname, status FROM certificates
            WHERE hostname = ANY($1::citext[]) AND $2::text IS NOT NULL
              AND tenant_id IS NOT NULL AND tenant_id <> $2
        ), refused AS (
            INSERT INTO certificate_events (certificate_id, hostname, from_status, to_status, message)
            SELECT id, hostname, status, status, $3 FROM owned
            RETURNING hostname
        ), upserted AS (
            INSERT INTO certificates AS c (hostname, tenant_id, requested_method)
            SELECT h, $2, coalesce($4, 'auto') FROM unnest($1::text[]) AS h
            WHERE NOT EXISTS (SELECT 1 FROM owned)
            ON CONFLICT (hostname) DO UPDATE SET
                tenant_id = coalesce(c.tenant_id, EXCLUDED.tenant_id),
                requested_method = CASE WHEN $4::text IS NULL THEN c.requested_method
                                        ELSE EXCLUDED.requested_method END,
                status = CASE WHEN c.status = 'CANCELED' THEN 'PENDING' ELSE c.status END,
                -- Asked again: a hostname given up on (DEPARTED) is tried again.
                provisioning_error = CASE WHEN c.provisioning_error = 'DEPARTED' THEN NULL
                                          ELSE c.provisioning_error END,
                updated_at = now()
            -- Also against a row another tenant inserted since ``owned`` was read.
            WHERE EXCLUDED.tenant_id IS NULL OR c.tenant_id IS NULL
               OR c.tenant_id = EXCLUDED.tenant_id
            RETURNING c.*
        )
        SELECT outcome.refused, written.*
        FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM refused)
                          THEN array(SELECT hostname::text FROM refused)
                          ELSE array(SELECT h FROM unnest($1::text[]) AS h
                                     WHERE h::citext NOT IN (SELECT hostname FROM upserted))
                     END AS refused) AS outcome
        LEFT JOIN (SELECT {record_columns("NULL")} FROM upserted AS c) AS written ON true
        """,
        list(hostnames),
        tenant_id,
        OWNED_ELSEWHERE,
        None if method is None else str(method),
    )
    refused: list[str] = found[0]["refused"]
    rows = {r["hostname"]: record_of(r) for r in found if r["certificate_id"] is not None}
    return Requested(refused, rows)

_STATE_COLUMNS = """
    hostname::text AS hostname, tenant_id, status,
    provisioning_error AS error_code, provisioning_error_message AS error_message,
    ssl_retry_count AS retry_count, ssl_serial AS serial, ssl_expires_at AS expires_at,
    ssl_issuer AS issuer, order_issuer
"""

async def certificate_state(pool: asyncpg.Pool, hostname: Hostname) -> CertificateState | None:
    """What the product sees of a certificate row (no key material)."""
    row = await pool.fetchrow(
        f"SELECT {_STATE_COLUMNS} FROM certificates WHERE hostname = $1", hostname
    )
    return CertificateState(**dict(row)) if row is not None else None

async def list_certificates(pool: asyncpg.Pool, status: str | None = None) -> list[CertificateState]:
    """What the product sees of every certificate (optionally of one status), by hostname."""
    rows = await pool.fetch(
        f"SELECT {_STATE_COLUMNS} FROM certificates"
        " WHERE $1::text IS NULL OR status = $1 ORDER BY hostname",
        status,
    )
    return [CertificateState(**dict(r)) for r in rows]

async def events(pool: asyncpg.Pool, hostname: Hostname, limit: int = 200) -> list[CertificateEvent]:
    """The hostname's transitions, oldest first (the last ``limit``)."""
    rows = await pool.fetch(
        """
        SELECT at, from_status, to_status, error_code, message FROM (
            SELECT * FROM certificate_events WHERE hostname = $1 ORDER BY id DESC LIMIT $2
        ) e ORDER BY id
        """,
        hostname,
        limit,
    )
    return [CertificateEvent(**dict(r)) for r in rows]

async def waiting_for_cooldown(pool: asyncpg.Pool) -> list[Hostname]:
    """Hostnames held back by a CA rate limit."""
    rows = await pool.fetch(
        "SELECT hostname::text AS hostname FROM certificates"
        " WHERE provisioning_error = 'ACME_RATE_LIMITED'"
    )
    return [Hostname(r["hostname"]) for r in rows]
