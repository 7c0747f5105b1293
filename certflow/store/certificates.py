"""Certificate rows in Postgres: every read and guarded transition.

Each transition names the status it expects to leave, so an activity retried
after its commit (or racing a cancel) finds the row moved on and does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from certflow.crypto import CertificateInfo
from certflow.errors import ErrorCode
from certflow.models import (
    CertificateStatus,
    CertificateEvent,
    CertificateRecord,
    CertificateState,
    OpenedOrder,
    OrderKind,
    Outcome,
    RenewalAdvice,
    RequestedMethod,
)

_RECORD_COLUMNS = """
    c.id::text AS certificate_id, c.hostname::text AS hostname, c.tenant_id, c.status,
    c.provisioning_error AS error_code, c.provisioning_error_message AS error_message,
    c.ssl_retry_count AS retry_count, c.http_order_url AS order_url,
    c.http_challenge_url AS challenge_url, c.ssl_not_before AS not_before,
    c.ssl_expires_at AS expires_at, c.ari_window_start, c.ari_window_end, c.ssl_serial AS serial,
    c.ssl_issuer AS issuer, c.order_issuer, c.ssl_issued_at AS issued_at,
    c.requested_method, c.validation_method,
    CASE
        WHEN $2::text IS NULL THEN false
        WHEN c.hostname::text = $2 OR right(c.hostname::text, length($2) + 1) = '.' || $2
            THEN coalesce((SELECT d.managed FROM custom_domains d WHERE d.domain = c.hostname), true)
        ELSE false
    END AS skips_dns
"""


def _record(row: asyncpg.Record) -> CertificateRecord:
    return CertificateRecord(**dict(row))


async def ensure_certificate(
    pool: asyncpg.Pool,
    hostname: str,
    tenant_id: str | None,
    managed_base_domain: str | None,
    method: RequestedMethod | None = None,
) -> CertificateRecord:
    """The row for hostname, inserted as PENDING when missing, marked as having a
    workflow (reconcile then leaves it alone): one statement. A method given (a
    backend's workflow input) becomes the row's."""
    row = await pool.fetchrow(
        f"""
        INSERT INTO certificates AS c (hostname, tenant_id, workflow_seen_at, requested_method)
        VALUES ($1, $3, now(), coalesce($4, 'auto'))
        ON CONFLICT (hostname) DO UPDATE SET
            workflow_seen_at = now(),
            requested_method = coalesce($4, c.requested_method)
        RETURNING {_RECORD_COLUMNS}
        """,
        hostname,
        managed_base_domain,
        tenant_id,
        None if method is None else str(method),
    )
    assert row is not None
    return _record(row)


async def persist_challenge(
    pool: asyncpg.Pool, certificate_id: str, order: OpenedOrder, method_reason: str | None = None
) -> bool:
    """Record the open order and move PENDING → PROVISIONING (a renewal, RENEWING or
    EXPIRED, keeps its status).

    Committed before the challenge is accepted, so the responder can answer the
    CA's first request. Returns False when the row vanished or moved on.
    """
    result = await pool.fetchval(
        """
        UPDATE certificates SET
            status = CASE WHEN status IN ('RENEWING', 'EXPIRED') THEN status
                          ELSE 'PROVISIONING' END,
            http_challenge_token = $2, http_challenge_key_auth = $3,
            http_challenge_url = $4, http_order_url = $5, http_order_replaces = $6,
            validation_method = $7, validation_reason = coalesce($8, validation_reason),
            provisioning_error = NULL, provisioning_error_message = NULL,
            ssl_last_attempt_at = now(), updated_at = now()
        WHERE id = $1::uuid
          AND (status IN ('PENDING', 'RENEWING', 'EXPIRED') AND http_order_url IS NULL
               OR http_order_url = $5)
        RETURNING true
        """,
        certificate_id,
        order.token,
        order.key_authorization,
        order.challenge_url,
        order.order_url,
        order.replaces,
        None if order.method is None else str(order.method),  # None: http-01, as before methods
        method_reason,
    )
    return bool(result)


async def attempt_request(pool: asyncpg.Pool, hostname: str) -> tuple[RequestedMethod, str | None]:
    """What the row asks of an attempt now: its validation method (``auto`` when no
    row) and its tenant (whose ownership may have to be proven)."""
    row = await pool.fetchrow(
        "SELECT requested_method, tenant_id FROM certificates WHERE hostname = $1", hostname
    )
    if row is None:
        return RequestedMethod.AUTO, None
    return RequestedMethod(row["requested_method"]), row["tenant_id"]


async def stored_open_order(pool: asyncpg.Pool, certificate_id: str) -> OpenedOrder | None:
    """The open order and challenge persisted on the row, if there is one."""
    row = await pool.fetchrow(
        """
        SELECT http_order_url, http_challenge_url, http_challenge_token, http_challenge_key_auth,
               http_order_replaces, validation_method
        FROM certificates
        WHERE id = $1::uuid AND http_order_url IS NOT NULL AND http_challenge_token IS NOT NULL
        """,
        certificate_id,
    )
    if row is None:
        return None
    return OpenedOrder(
        order_url=row["http_order_url"],
        challenge_url=row["http_challenge_url"],
        token=row["http_challenge_token"],
        key_authorization=row["http_challenge_key_auth"],
        replaces=row["http_order_replaces"],
        method=row["validation_method"],
    )


async def store_pending_key(
    pool: asyncpg.Pool, certificate_id: str, order_url: str, encrypted_key: bytes
) -> bool:
    """Bind a new encrypted key to the open order, unless one is bound already."""
    result = await pool.fetchval(
        """
        UPDATE certificates SET pending_private_key = $3, pending_key_order_url = $2,
            updated_at = now()
        WHERE id = $1::uuid AND http_order_url = $2
          AND (pending_key_order_url IS DISTINCT FROM $2 OR pending_private_key IS NULL)
        RETURNING true
        """,
        certificate_id,
        order_url,
        encrypted_key,
    )
    return bool(result)


async def load_pending_key(pool: asyncpg.Pool, certificate_id: str, order_url: str) -> bytes | None:
    """The encrypted key bound to this order, if any."""
    value = await pool.fetchval(
        "SELECT pending_private_key FROM certificates"
        " WHERE id = $1::uuid AND pending_key_order_url = $2",
        certificate_id,
        order_url,
    )
    return bytes(value) if value is not None else None


async def store_issued(
    pool: asyncpg.Pool,
    certificate_id: str,
    order_url: str,
    leaf_pem: str,
    chain_pem: str,
    info: CertificateInfo,
    window: RenewalAdvice | None = None,
    next_check_at: datetime | None = None,
) -> bool:
    """Make the order's certificate current: ACTIVE, budget reset, ACME state cleared.

    The key is the one already stored for the order; ``window`` is the CA's first
    ARI answer for the new certificate and ``next_check_at`` when to ask again
    (without them the renewal-info sweep asks at its next pass). Returns True also
    when a previous attempt of the same store already committed.
    """
    window = window or RenewalAdvice()
    async with pool.acquire() as conn:
        stored = await conn.fetchval(
            """
            UPDATE certificates SET
                status = 'ACTIVE', ssl_certificate = $3, ssl_certificate_chain = $4,
                encrypted_ssl_private_key = pending_private_key, ssl_replaces = http_order_replaces,
                replaces_failing_since = NULL, ssl_issued_at = now(),
                ssl_issuer = order_issuer,
                ari_window_start = $8, ari_window_end = $9,
                ari_next_check_at = coalesce($10, now()),
                ssl_serial = $5, ssl_not_before = $6, ssl_expires_at = $7, ssl_order_url = $2,
                ssl_retry_count = 0, ssl_last_attempt_at = NULL,
                provisioning_error = NULL, provisioning_error_message = NULL,
                http_challenge_token = NULL, http_challenge_key_auth = NULL,
                http_challenge_url = NULL, http_order_url = NULL, http_order_replaces = NULL,
                pending_private_key = NULL, pending_key_order_url = NULL,
                updated_at = now()
            WHERE id = $1::uuid AND http_order_url = $2 AND pending_key_order_url = $2
              AND status IN ('PROVISIONING', 'RENEWING', 'PENDING', 'EXPIRED')
            RETURNING true
            """,
            certificate_id,
            order_url,
            leaf_pem,
            chain_pem,
            info.serial_hex,
            info.not_before,
            info.not_after,
            window.window_start,
            window.window_end,
            next_check_at,
        )
        if stored:
            return True
        already = await conn.fetchval(
            "SELECT ssl_serial = $2 AND status = 'ACTIVE' FROM certificates WHERE id = $1::uuid",
            certificate_id,
            info.serial_hex,
        )
        return bool(already)


async def issued_by_order(
    pool: asyncpg.Pool, certificate_id: str, order_url: str
) -> tuple[str, RenewalAdvice] | None:
    """The current leaf PEM and its stored ARI window when this order already issued
    and stored it (a retried store)."""
    row = await pool.fetchrow(
        "SELECT ssl_certificate, ari_window_start, ari_window_end FROM certificates"
        " WHERE id = $1::uuid AND ssl_order_url = $2 AND http_order_url IS NULL",
        certificate_id,
        order_url,
    )
    if row is None or row["ssl_certificate"] is None:
        return None
    window = RenewalAdvice(window_start=row["ari_window_start"], window_end=row["ari_window_end"])
    return str(row["ssl_certificate"]), window


async def record_failure(
    pool: asyncpg.Pool, certificate_id: str, outcome: Outcome, message: str
) -> bool:
    """Apply a failed attempt's outcome in one statement."""
    result = await pool.fetchval(
        """
        UPDATE certificates SET
            status = $2, ssl_retry_count = $3,
            provisioning_error = $4, provisioning_error_message = $5,
            ssl_last_attempt_at = now(), updated_at = now(),
            http_challenge_token = CASE WHEN $6 THEN http_challenge_token END,
            http_challenge_key_auth = CASE WHEN $6 THEN http_challenge_key_auth END,
            http_challenge_url = CASE WHEN $6 THEN http_challenge_url END,
            http_order_url = CASE WHEN $6 THEN http_order_url END,
            pending_private_key = CASE WHEN $6 THEN pending_private_key END,
            pending_key_order_url = CASE WHEN $6 THEN pending_key_order_url END
        WHERE id = $1::uuid AND status NOT IN ('ACTIVE', 'CANCELED')
        RETURNING true
        """,
        certificate_id,
        str(outcome.status),
        outcome.retry_count,
        str(outcome.error_code),
        message[:2000],
        outcome.keep_order,
    )
    return bool(result)


async def challenge_key_authorization(pool: asyncpg.Pool, token: str, hostname: str) -> str | None:
    """The key authorization of an open challenge (or a live probe of ``check``)
    for this token and hostname."""
    value = await pool.fetchval(
        """
        SELECT http_challenge_key_auth FROM certificates
        WHERE http_challenge_token = $1 AND hostname = $2
          AND coalesce(validation_method, 'http-01') = 'http-01'
        UNION ALL
        SELECT key_authorization FROM http01_probes
        WHERE token = $1 AND hostname = $2 AND expires_at > now()
        LIMIT 1
        """,
        token,
        hostname,
    )
    return str(value) if value is not None else None


async def add_probe(pool: asyncpg.Pool, hostname: str, token: str, key_authorization: str) -> None:
    """A challenge the responder answers for a minute, with no order behind it."""
    await pool.execute(
        "INSERT INTO http01_probes (token, hostname, key_authorization, expires_at)"
        " VALUES ($1, $2, $3, now() + interval '1 minute')",
        token,
        hostname,
        key_authorization,
    )


async def remove_probe(pool: asyncpg.Pool, token: str) -> None:
    """Remove the probe, and any left behind by a check that died mid-way."""
    await pool.execute(
        "DELETE FROM http01_probes WHERE token = $1 OR expires_at < now()", token
    )


OWNED_ELSEWHERE = "refused: requested by another tenant"
"""The message of the event a refused request leaves on the hostname's row."""


async def give_up(
    pool: asyncpg.Pool, certificate_id: str, status: CertificateStatus, code: ErrorCode, message: str
) -> bool:
    """Stop trying for a hostname: a PENDING row CANCELED, or an EXPIRED row kept
    EXPIRED, with the code that says why (ABANDONED, DEPARTED) and any open order
    dropped. False when the row is gone or moved on."""
    result = await pool.fetchval(
        """
        UPDATE certificates SET
            status = $2, provisioning_error = $3, provisioning_error_message = $4,
            http_order_url = NULL, http_challenge_url = NULL, http_challenge_token = NULL,
            http_challenge_key_auth = NULL, updated_at = now()
        WHERE id = $1::uuid
          AND (($2 = 'CANCELED' AND status IN ('PENDING', 'PROVISIONING'))
               OR ($2 = 'EXPIRED' AND status = 'EXPIRED'))
        RETURNING true
        """,
        certificate_id,
        str(status),
        str(code),
        message,
    )
    return bool(result)


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
            RETURNING {_RECORD_COLUMNS}
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
    return before, _record(row)


async def request_certificates(
    pool: asyncpg.Pool,
    hostnames: Sequence[str],
    tenant_id: str | None,
    method: RequestedMethod | None = None,
) -> list[str]:
    """Upsert the rows a product asks for, in one statement; a canceled one is
    requested again. A hostname of another tenant is refused: then nothing is
    written but an event on each such row, and their names are returned. A request
    without a tenant keeps the row's; a row without one takes the requester's. A
    request without a method keeps the row's (``auto`` for a new row)."""
    refused: list[str] = await pool.fetchval(
        """
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
            RETURNING c.hostname
        )
        SELECT CASE WHEN EXISTS (SELECT 1 FROM refused)
                    THEN array(SELECT hostname::text FROM refused)
                    ELSE array(SELECT h FROM unnest($1::text[]) AS h
                               WHERE h::citext NOT IN (SELECT hostname FROM upserted)) END
        """,
        list(hostnames),
        tenant_id,
        OWNED_ELSEWHERE,
        None if method is None else str(method),
    )
    return refused


_STATE_COLUMNS = """
    hostname::text AS hostname, tenant_id, status,
    provisioning_error AS error_code, provisioning_error_message AS error_message,
    ssl_retry_count AS retry_count, ssl_serial AS serial, ssl_expires_at AS expires_at,
    ssl_issuer AS issuer, order_issuer
"""


async def certificate_state(pool: asyncpg.Pool, hostname: str) -> CertificateState | None:
    """What the product sees of a certificate row (no key material)."""
    row = await pool.fetchrow(
        f"SELECT {_STATE_COLUMNS} FROM certificates WHERE hostname = $1", hostname
    )
    return CertificateState(**dict(row)) if row is not None else None


async def load_record(
    pool: asyncpg.Pool, certificate_id: str, managed_base_domain: str | None
) -> CertificateRecord | None:
    row = await pool.fetchrow(
        f"SELECT {_RECORD_COLUMNS} FROM certificates c WHERE c.id = $1::uuid",
        certificate_id,
        managed_base_domain,
    )
    return _record(row) if row is not None else None


async def reopen_failed(pool: asyncpg.Pool, certificate_id: str) -> bool:
    """FAILED → a fresh failure budget: PENDING, or RENEWING/EXPIRED when a certificate
    is in place (retry now, or the slow automatic retry)."""
    result = await pool.fetchval(
        """
        UPDATE certificates SET
            status = CASE WHEN ssl_certificate IS NULL THEN 'PENDING'
                          WHEN ssl_expires_at <= now() THEN 'EXPIRED'
                          ELSE 'RENEWING' END,
            ssl_retry_count = 0, updated_at = now()
        WHERE id = $1::uuid AND status = 'FAILED'
        RETURNING true
        """,
        certificate_id,
    )
    return bool(result)


async def begin_renewal(pool: asyncpg.Pool, certificate_id: str) -> bool:
    """ACTIVE → RENEWING; the current certificate stays in place and keeps being served."""
    result = await pool.fetchval(
        "UPDATE certificates SET status = 'RENEWING', updated_at = now()"
        " WHERE id = $1::uuid AND status = 'ACTIVE' RETURNING true",
        certificate_id,
    )
    return bool(result)


async def mark_expired(pool: asyncpg.Pool, certificate_id: str) -> bool:
    """RENEWING → EXPIRED once the current certificate's not_after has passed."""
    result = await pool.fetchval(
        "UPDATE certificates SET status = 'EXPIRED', updated_at = now()"
        " WHERE id = $1::uuid AND status = 'RENEWING' AND ssl_expires_at <= now()"
        " RETURNING true",
        certificate_id,
    )
    return bool(result)


async def cancel(pool: asyncpg.Pool, certificate_id: str) -> str | None:
    """Any status → CANCELED, clearing the open order; returns that order's URL."""
    async with pool.acquire() as conn, conn.transaction():
        order_url = await conn.fetchval(
            "SELECT http_order_url FROM certificates WHERE id = $1::uuid FOR UPDATE",
            certificate_id,
        )
        await conn.execute(
            """
            UPDATE certificates SET status = 'CANCELED',
                http_challenge_token = NULL, http_challenge_key_auth = NULL,
                http_challenge_url = NULL, http_order_url = NULL,
                pending_private_key = NULL, pending_key_order_url = NULL,
                updated_at = now()
            WHERE id = $1::uuid
            """,
            certificate_id,
        )
    return str(order_url) if order_url is not None else None


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


@dataclass(frozen=True)
class RenewalInfoRow:
    certificate_id: str
    hostname: str
    serial: str
    leaf_pem: str
    window_start: datetime | None
    window_end: datetime | None
    issuer: str | None = None
    """The CA that issued it, whose ARI is asked (None: the first configured)."""


async def renewal_info_due(pool: asyncpg.Pool, limit: int) -> list[RenewalInfoRow]:
    """ACTIVE certificates whose renewal info is due for a check, most overdue first."""
    rows = await pool.fetch(
        """
        SELECT id::text AS certificate_id, hostname::text AS hostname, ssl_serial AS serial,
               ssl_certificate AS leaf_pem, ari_window_start AS window_start,
               ari_window_end AS window_end, ssl_issuer AS issuer
        FROM certificates
        WHERE status = 'ACTIVE' AND ari_next_check_at IS NOT NULL AND ari_next_check_at <= now()
        ORDER BY ari_next_check_at
        LIMIT $1
        """,
        limit,
    )
    return [RenewalInfoRow(**dict(r)) for r in rows]


async def record_renewal_info(
    pool: asyncpg.Pool,
    answers: Sequence[tuple[str, str, datetime | None, datetime | None, datetime]],
) -> None:
    """(id, serial, window start, window end, next check) for each certificate asked,
    in one statement; a check that got no window keeps the stored one, and an answer
    about a certificate since replaced is dropped."""
    await pool.execute(
        """
        UPDATE certificates c SET
            ari_window_start = coalesce(a.window_start, c.ari_window_start),
            ari_window_end = coalesce(a.window_end, c.ari_window_end),
            ari_next_check_at = a.next_check
        FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[],
                    $5::timestamptz[])
            AS a(id, serial, window_start, window_end, next_check)
        WHERE c.id = a.id AND c.ssl_serial = a.serial
        """,
        [a[0] for a in answers],
        [a[1] for a in answers],
        [a[2] for a in answers],
        [a[3] for a in answers],
        [a[4] for a in answers],
    )


async def order_kind(pool: asyncpg.Pool, hostname: str) -> OrderKind:
    """RENEWAL when the hostname has a certificate (the same identifier set as one
    already issued), NEW otherwise."""
    renewal = await pool.fetchval(
        "SELECT ssl_certificate IS NOT NULL FROM certificates WHERE hostname = $1", hostname
    )
    return OrderKind.RENEWAL if renewal else OrderKind.NEW


@dataclass(frozen=True)
class AttemptIssuer:
    """Whom the attempt under way orders from, and whether it renews a certificate
    of that same CA (None: the first configured issuer)."""

    order_issuer: str | None
    certificate_issuer: str | None
    has_certificate: bool


async def attempt_issuer(pool: asyncpg.Pool, hostname: str) -> AttemptIssuer:
    row = await pool.fetchrow(
        "SELECT order_issuer, ssl_issuer, ssl_certificate IS NOT NULL AS has_certificate"
        " FROM certificates WHERE hostname = $1",
        hostname,
    )
    if row is None:
        return AttemptIssuer(None, None, False)
    return AttemptIssuer(row["order_issuer"], row["ssl_issuer"], bool(row["has_certificate"]))


async def choose_issuer(
    pool: asyncpg.Pool, certificate_id: str, issuer: str, reason: str | None
) -> None:
    """Record the attempt's issuer (an event when it changes with a reason)."""
    await pool.execute(
        """
        UPDATE certificates SET order_issuer = $2, order_issuer_reason = $3, updated_at = now()
        WHERE id = $1::uuid AND order_issuer IS DISTINCT FROM $2
        """,
        certificate_id,
        issuer,
        reason,
    )


async def certificate_issuer(pool: asyncpg.Pool, certificate_id: str) -> str | None:
    """The issuer of the current certificate (None: the first configured)."""
    value = await pool.fetchval(
        "SELECT ssl_issuer FROM certificates WHERE id = $1::uuid", certificate_id
    )
    return str(value) if value is not None else None


@dataclass(frozen=True)
class ReplacedCertificate:
    """The certificate a renewal replaces, and for how long the CA has failed to
    check ``replaces`` for it (0: it has not)."""

    leaf_pem: str
    failing_for_seconds: float


async def replaced_certificate(pool: asyncpg.Pool, certificate_id: str) -> ReplacedCertificate | None:
    row = await pool.fetchrow(
        """SELECT ssl_certificate,
                  coalesce(extract(epoch FROM now() - replaces_failing_since), 0) AS failing
           FROM certificates WHERE id = $1::uuid AND ssl_certificate IS NOT NULL""",
        certificate_id,
    )
    if row is None:
        return None
    return ReplacedCertificate(str(row["ssl_certificate"]), float(row["failing"]))


async def note_replaces_failing(pool: asyncpg.Pool, certificate_id: str) -> None:
    """The CA failed (5xx) to check this renewal's ``replaces``: since when, kept."""
    await pool.execute(
        """UPDATE certificates SET replaces_failing_since = coalesce(replaces_failing_since, now())
           WHERE id = $1::uuid""",
        certificate_id,
    )


async def current_certificate_pem(pool: asyncpg.Pool, certificate_id: str) -> str | None:
    """The current leaf PEM (public), if any."""
    value = await pool.fetchval(
        "SELECT ssl_certificate FROM certificates WHERE id = $1::uuid", certificate_id
    )
    return str(value) if value is not None else None


async def list_certificates(pool: asyncpg.Pool, status: str | None = None) -> list[CertificateState]:
    """What the product sees of every certificate (optionally of one status), by hostname."""
    rows = await pool.fetch(
        f"SELECT {_STATE_COLUMNS} FROM certificates"
        " WHERE $1::text IS NULL OR status = $1 ORDER BY hostname",
        status,
    )
    return [CertificateState(**dict(r)) for r in rows]


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


async def rename(pool: asyncpg.Pool, certificate_id: str, hostname: str) -> bool:
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


async def waiting_for_cooldown(pool: asyncpg.Pool) -> list[str]:
    """Hostnames held back by a CA rate limit."""
    rows = await pool.fetch(
        "SELECT hostname::text AS hostname FROM certificates"
        " WHERE provisioning_error = 'ACME_RATE_LIMITED'"
    )
    return [r["hostname"] for r in rows]


async def events(pool: asyncpg.Pool, hostname: str, limit: int = 200) -> list[CertificateEvent]:
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
