"""What the renewal-info sweep reads and writes: due certificates and the CA's
windows (RFC 9773)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg



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
