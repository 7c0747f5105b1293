"""The issued certificate and the key bound to its order before finalize
(docs/guarantees.md, "Crash safety"): stored encrypted, paired with a valid order after a crash."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from certflow.crypto import CertificateInfo
from certflow.activity_payloads import RenewalAdvice
from certflow.models import CertificateRecord
from certflow.store.certificates import RECORD_COLUMNS, record_columns, record_of


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

async def store_issued(
    pool: asyncpg.Pool,
    certificate_id: str,
    order_url: str,
    leaf_pem: str,
    chain_pem: str,
    info: CertificateInfo,
    window: RenewalAdvice | None = None,
    next_check_at: datetime | None = None,
    managed_base_domain: str | None = None,
) -> CertificateRecord | None:
    """Make the order's certificate current: ACTIVE, budget reset, ACME state cleared.

    The key is the one already stored for the order; ``window`` is the CA's first
    ARI answer for the new certificate and ``next_check_at`` when to ask again
    (without them the renewal-info sweep asks at its next pass). Returns the row as
    it left it, also when a previous attempt of the same store already committed;
    None when the row moved on.
    """
    window = window or RenewalAdvice()
    async with pool.acquire() as conn:
        stored = await conn.fetchrow(
            f"""
            UPDATE certificates AS c SET
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
            RETURNING {record_columns("$11")}
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
            managed_base_domain,
        )
        if stored is None:
            stored = await conn.fetchrow(
                f"SELECT {RECORD_COLUMNS} FROM certificates c"
                " WHERE c.id = $1::uuid AND c.ssl_serial = $3 AND c.status = 'ACTIVE'",
                certificate_id,
                managed_base_domain,
                info.serial_hex,
            )
        return record_of(stored) if stored is not None else None

@dataclass(frozen=True)
class Finalization:
    """Where finalize_and_store stands for one order, read at once."""

    stored: tuple[str, RenewalAdvice, CertificateRecord] | None
    """The current leaf PEM, its stored ARI window and the row when this order
    already issued and stored it (a retried store)."""
    pending_key: bytes | None
    """The encrypted key bound to this order, if any."""


async def finalization(
    pool: asyncpg.Pool, certificate_id: str, order_url: str, managed_base_domain: str | None = None
) -> Finalization:
    """What an earlier try of finalize_and_store for this order left: the stored
    certificate, the key bound to the order (one read)."""
    row = await pool.fetchrow(
        "SELECT CASE WHEN ssl_order_url = $2 AND http_order_url IS NULL THEN ssl_certificate END"
        " AS stored_leaf,"
        " CASE WHEN pending_key_order_url = $2 THEN pending_private_key END AS pending_key,"
        f" {record_columns('$3')}"
        " FROM certificates c WHERE c.id = $1::uuid",
        certificate_id,
        order_url,
        managed_base_domain,
    )
    if row is None:
        return Finalization(None, None)
    stored = None
    if row["stored_leaf"] is not None:
        window = RenewalAdvice(window_start=row["ari_window_start"], window_end=row["ari_window_end"])
        stored = (str(row["stored_leaf"]), window, record_of(row))
    key = row["pending_key"]
    return Finalization(stored, bytes(key) if key is not None else None)
