"""Certificate rows as the workflow reads and moves them: every guarded transition.

Each transition names the status it expects to leave, so an activity retried
after its commit (or racing a cancel) finds the row moved on and does nothing.
The rest of the rows' SQL is by purpose: ``issued`` (the key and certificate),
``challenges`` (the responder), ``requests`` (the product), ``attempts`` (which
CA), ``renewal_info`` (the sweep), ``reconcile``.
"""

from __future__ import annotations


import asyncpg

from certflow.store import order_slots
from certflow.errors import ErrorCode
from certflow.hostnames import Hostname
from certflow.models import CertificateStatus, CertificateRecord, RequestedMethod
from certflow.activity_payloads import OpenedOrder, Outcome, PlacedOrder


def record_columns(domain: str) -> str:
    """The columns of a CertificateRecord from row ``c``; ``domain`` is the
    placeholder of the managed base domain (whether the row skips DNS checks)."""
    return f"""
    c.id::text AS certificate_id, c.hostname::text AS hostname, c.tenant_id, c.status,
    c.provisioning_error AS error_code, c.provisioning_error_message AS error_message,
    c.ssl_retry_count AS retry_count, c.http_order_url AS order_url,
    c.http_challenge_url AS challenge_url, c.ssl_not_before AS not_before,
    c.ssl_expires_at AS expires_at, c.ari_window_start, c.ari_window_end, c.ssl_serial AS serial,
    c.ssl_issuer AS issuer, c.order_issuer, c.ssl_issued_at AS issued_at,
    c.requested_method, c.validation_method,
    CASE
        WHEN {domain}::text IS NULL THEN false
        WHEN c.hostname::text = {domain}
          OR right(c.hostname::text, length({domain}) + 1) = '.' || {domain}
            THEN coalesce((SELECT d.managed FROM custom_domains d WHERE d.domain = c.hostname), true)
        ELSE false
    END AS skips_dns
"""


RECORD_COLUMNS = record_columns("$2")

def record_of(row: asyncpg.Record) -> CertificateRecord:
    """The record among a row's columns (a statement may return others beside it)."""
    return CertificateRecord(**{name: row[name] for name in CertificateRecord.model_fields})

async def ensure_certificate(
    pool: asyncpg.Pool,
    hostname: Hostname,
    tenant_id: str | None,
    managed_base_domain: str | None,
    method: RequestedMethod | None = None,
) -> CertificateRecord:
    """The row for hostname, one statement: read; marked as having a workflow
    (reconcile then leaves it alone) by the first run that reads it; inserted as
    PENDING only when missing (a workflow a backend started itself: a request's row
    is the client's one INSERT). A method given (a backend's workflow input) becomes
    the row's."""
    # A data-modifying CTE's changes are seen only through its RETURNING, so the row
    # comes from whichever branch acted: marked, inserted, or read as it was.
    statement = f"""
        WITH marked AS (
            UPDATE certificates AS c SET
                workflow_seen_at = coalesce(c.workflow_seen_at, now()),
                requested_method = coalesce($4, c.requested_method)
            WHERE c.hostname = $1
              AND (c.workflow_seen_at IS NULL OR $4::text <> c.requested_method)
            RETURNING c.*
        ), inserted AS (
            INSERT INTO certificates AS c (hostname, tenant_id, workflow_seen_at, requested_method)
            SELECT $1, $3, now(), coalesce($4, 'auto')
            WHERE NOT EXISTS (SELECT 1 FROM certificates WHERE hostname = $1)
            ON CONFLICT (hostname) DO NOTHING
            RETURNING c.*
        )
        SELECT {RECORD_COLUMNS}
        FROM (
            SELECT * FROM marked
            UNION ALL SELECT * FROM inserted
            UNION ALL SELECT * FROM certificates
                      WHERE hostname = $1 AND NOT EXISTS (SELECT 1 FROM marked)
        ) AS c
    """
    arguments = (hostname, managed_base_domain, tenant_id, None if method is None else str(method))
    row = await pool.fetchrow(statement, *arguments)
    if row is None:  # a request inserted it after this statement's snapshot: there now
        row = await pool.fetchrow(statement, *arguments)
    assert row is not None
    return record_of(row)

async def run_before(pool: asyncpg.Pool, hostname: str) -> bool:
    """Whether a workflow already ran for the row of this hostname, spelled exactly
    so (the column compares case-insensitively)."""
    return bool(
        await pool.fetchval(
            "SELECT workflow_seen_at IS NOT NULL FROM certificates"
            " WHERE hostname = $1 AND hostname::text = $1",
            hostname,
        )
    )

async def persist_challenge(
    db: asyncpg.Pool | asyncpg.Connection,
    certificate_id: str,
    order: OpenedOrder,
    method_reason: str | None = None,
    issuer: str | None = None,
    issuer_reason: str | None = None,
    managed_base_domain: str | None = None,
    let_go: tuple[str, int] | None = None,
) -> CertificateRecord | None:
    """Record the open order and move PENDING → PROVISIONING (a renewal, RENEWING or
    EXPIRED, keeps its status); with ``issuer``, the attempt's CA too, as
    ``attempts.choose_issuer`` records it (in the same statement). With
    ``let_go`` (directory URL, slot), the same statement lets go of the order
    slot ``db``, a connection, holds (certflow/acme/slots.py).

    Committed before the challenge is accepted, so the responder can answer the
    CA's first request. Returns the row as it left it; None when the row vanished
    or moved on.
    """
    statement = f"""
        UPDATE certificates AS c SET
            status = CASE WHEN status IN ('RENEWING', 'EXPIRED') THEN status
                          ELSE 'PROVISIONING' END,
            http_challenge_token = $2, http_challenge_key_auth = $3,
            http_challenge_url = $4, http_order_url = $5, http_order_replaces = $6,
            validation_method = $7, validation_reason = coalesce($8, validation_reason),
            order_issuer_reason = CASE WHEN $9::text IS NOT NULL AND $9 IS DISTINCT FROM order_issuer
                                       THEN $10 ELSE order_issuer_reason END,
            order_issuer = coalesce($9, order_issuer),
            provisioning_error = NULL, provisioning_error_message = NULL,
            ssl_last_attempt_at = now(), updated_at = now()
        WHERE id = $1::uuid
          AND (status IN ('PENDING', 'RENEWING', 'EXPIRED') AND http_order_url IS NULL
               OR http_order_url = $5)
        RETURNING {record_columns("$11")}
    """
    arguments: tuple[object, ...] = ()
    if let_go is not None:
        # One row whatever the update did, so the slot is let go of either way.
        statement = f"""
            WITH persisted AS ({statement})
            SELECT persisted.*, {order_slots.let_go("$12", "$13")} AS let_go
            FROM (SELECT) AS one LEFT JOIN persisted ON true
        """
        arguments = let_go
    row = await db.fetchrow(
        statement,
        certificate_id,
        order.token,
        order.key_authorization,
        order.challenge_url,
        order.order_url,
        order.replaces,
        None if order.method is None else str(order.method),  # None: http-01, as before methods
        method_reason,
        issuer,
        issuer_reason,
        managed_base_domain,
        *arguments,
    )
    return record_of(row) if row is not None and row["certificate_id"] is not None else None

async def attempt_request(pool: asyncpg.Pool, hostname: Hostname) -> tuple[RequestedMethod, str | None]:
    """What the row asks of an attempt now: its validation method (``auto`` when no
    row) and its tenant (whose ownership may have to be proven)."""
    row = await pool.fetchrow(
        "SELECT requested_method, tenant_id FROM certificates WHERE hostname = $1", hostname
    )
    if row is None:
        return RequestedMethod.AUTO, None
    return RequestedMethod(row["requested_method"]), row["tenant_id"]

async def stored_open_order(
    pool: asyncpg.Pool, certificate_id: str, managed_base_domain: str | None = None
) -> PlacedOrder | None:
    """The open order and challenge persisted on the row, if there is one, with the
    row (whether it skips DNS checks read against ``managed_base_domain``)."""
    row = await pool.fetchrow(
        f"""
        SELECT http_order_url, http_challenge_token, http_challenge_key_auth,
               http_order_replaces, {RECORD_COLUMNS}
        FROM certificates c
        WHERE c.id = $1::uuid AND http_order_url IS NOT NULL AND http_challenge_token IS NOT NULL
        """,
        certificate_id,
        managed_base_domain,
    )
    if row is None:
        return None
    return PlacedOrder(
        order_url=row["http_order_url"],
        challenge_url=row["challenge_url"],
        token=row["http_challenge_token"],
        key_authorization=row["http_challenge_key_auth"],
        replaces=row["http_order_replaces"],
        method=row["validation_method"],
        row=record_of(row),
    )

async def record_failure(
    pool: asyncpg.Pool,
    certificate_id: str,
    outcome: Outcome,
    message: str,
    managed_base_domain: str | None = None,
) -> CertificateRecord | None:
    """Apply a failed attempt's outcome in one statement; the row as it left it, or
    None when the row is gone or done (ACTIVE, CANCELED)."""
    row = await pool.fetchrow(
        f"""
        UPDATE certificates AS c SET
            status = $2, ssl_retry_count = $3,
            provisioning_error = $4, provisioning_error_message = $5,
            ssl_last_attempt_at = now(), updated_at = now(),
            -- A run that took its row from the request marks it here when its
            -- first attempt fails before an order slot (reconcile's cue).
            workflow_seen_at = coalesce(workflow_seen_at, now()),
            http_challenge_token = CASE WHEN $6 THEN http_challenge_token END,
            http_challenge_key_auth = CASE WHEN $6 THEN http_challenge_key_auth END,
            http_challenge_url = CASE WHEN $6 THEN http_challenge_url END,
            http_order_url = CASE WHEN $6 THEN http_order_url END,
            pending_private_key = CASE WHEN $6 THEN pending_private_key END,
            pending_key_order_url = CASE WHEN $6 THEN pending_key_order_url END
        WHERE id = $1::uuid AND status NOT IN ('ACTIVE', 'CANCELED')
        RETURNING {record_columns("$7")}
        """,
        certificate_id,
        str(outcome.status),
        outcome.retry_count,
        str(outcome.error_code),
        message[:2000],
        outcome.keep_order,
        managed_base_domain,
    )
    return record_of(row) if row is not None else None

async def give_up(
    pool: asyncpg.Pool,
    certificate_id: str,
    status: CertificateStatus,
    code: ErrorCode,
    message: str,
    managed_base_domain: str | None = None,
) -> tuple[CertificateRecord | None, bool]:
    """Stop trying for a hostname: a PENDING row CANCELED, or an EXPIRED row kept
    EXPIRED, with the code that says why (ABANDONED, DEPARTED) and any open order
    dropped. Returns (the row as it left it, first): no row when it is gone or moved
    on; first False when the row already had that code (an attempt retried after its
    commit, whose answer was lost)."""
    row = await pool.fetchrow(
        f"""
        UPDATE certificates AS c SET
            status = $2, provisioning_error = $3, provisioning_error_message = $4,
            http_order_url = NULL, http_challenge_url = NULL, http_challenge_token = NULL,
            http_challenge_key_auth = NULL, updated_at = now()
        FROM (SELECT provisioning_error FROM certificates WHERE id = $1::uuid FOR UPDATE) AS before
        WHERE c.id = $1::uuid
          AND (($2 = 'CANCELED' AND c.status IN ('PENDING', 'PROVISIONING'))
               OR ($2 = 'EXPIRED' AND c.status = 'EXPIRED'))
        RETURNING {record_columns("$5")}, before.provisioning_error IS DISTINCT FROM $3 AS first
        """,
        certificate_id,
        str(status),
        str(code),
        message,
        managed_base_domain,
    )
    return (None, False) if row is None else (record_of(row), bool(row["first"]))

async def load_record(
    pool: asyncpg.Pool, certificate_id: str, managed_base_domain: str | None
) -> CertificateRecord | None:
    row = await pool.fetchrow(
        f"SELECT {RECORD_COLUMNS} FROM certificates c WHERE c.id = $1::uuid",
        certificate_id,
        managed_base_domain,
    )
    return record_of(row) if row is not None else None

async def reopen_failed(
    pool: asyncpg.Pool, certificate_id: str, managed_base_domain: str | None = None
) -> CertificateRecord | None:
    """FAILED → a fresh failure budget: PENDING, or RENEWING/EXPIRED when a certificate
    is in place (retry now, or the slow automatic retry). The row as it left it; None
    when it was not FAILED."""
    row = await pool.fetchrow(
        f"""
        UPDATE certificates AS c SET
            status = CASE WHEN ssl_certificate IS NULL THEN 'PENDING'
                          WHEN ssl_expires_at <= now() THEN 'EXPIRED'
                          ELSE 'RENEWING' END,
            ssl_retry_count = 0, updated_at = now()
        WHERE id = $1::uuid AND status = 'FAILED'
        RETURNING {RECORD_COLUMNS}
        """,
        certificate_id,
        managed_base_domain,
    )
    return record_of(row) if row is not None else None

async def begin_renewal(
    pool: asyncpg.Pool, certificate_id: str, managed_base_domain: str | None = None
) -> CertificateRecord | None:
    """ACTIVE → RENEWING; the current certificate stays in place and keeps being
    served. The row as it left it; None when it was not ACTIVE."""
    row = await pool.fetchrow(
        "UPDATE certificates AS c SET status = 'RENEWING', updated_at = now()"
        f" WHERE id = $1::uuid AND status = 'ACTIVE' RETURNING {RECORD_COLUMNS}",
        certificate_id,
        managed_base_domain,
    )
    return record_of(row) if row is not None else None

async def mark_expired(
    pool: asyncpg.Pool, certificate_id: str, managed_base_domain: str | None = None
) -> CertificateRecord | None:
    """RENEWING → EXPIRED once the current certificate's not_after has passed. The
    row as it left it; None when it was not RENEWING or has not expired."""
    row = await pool.fetchrow(
        "UPDATE certificates AS c SET status = 'EXPIRED', updated_at = now()"
        " WHERE id = $1::uuid AND status = 'RENEWING' AND ssl_expires_at <= now()"
        f" RETURNING {RECORD_COLUMNS}",
        certificate_id,
        managed_base_domain,
    )
    return record_of(row) if row is not None else None

async def cancel(
    pool: asyncpg.Pool, certificate_id: str, managed_base_domain: str | None = None
) -> tuple[str | None, CertificateRecord | None]:
    """Any status → CANCELED, clearing the open order: (that order's URL, the row as
    the cancel left it; None when the row is gone)."""
    async with pool.acquire() as conn, conn.transaction():
        order_url = await conn.fetchval(
            "SELECT http_order_url FROM certificates WHERE id = $1::uuid FOR UPDATE",
            certificate_id,
        )
        row = await conn.fetchrow(
            f"""
            UPDATE certificates AS c SET status = 'CANCELED',
                http_challenge_token = NULL, http_challenge_key_auth = NULL,
                http_challenge_url = NULL, http_order_url = NULL,
                pending_private_key = NULL, pending_key_order_url = NULL,
                updated_at = now()
            WHERE id = $1::uuid
            RETURNING {RECORD_COLUMNS}
            """,
            certificate_id,
            managed_base_domain,
        )
    return (
        str(order_url) if order_url is not None else None,
        record_of(row) if row is not None else None,
    )

async def delete(pool: asyncpg.Pool, certificate_id: str) -> bool:
    """Remove the certificate row and its custom_domains rows."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "DELETE FROM custom_domains WHERE certificate_id = $1::uuid"
            " OR domain = (SELECT hostname FROM certificates WHERE id = $1::uuid)",
            certificate_id,
        )
        result = await conn.fetchval(
            "DELETE FROM certificates WHERE id = $1::uuid RETURNING true", certificate_id
        )
    return bool(result)
