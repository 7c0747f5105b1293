"""The certificates a TLS edge serves, as Postgres holds them (the key encrypted),
and the figures the metrics refresh reads: every read keyset-paged or indexed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

SERVED_STATUSES = ("ACTIVE", "RENEWING", "EXPIRED", "FAILED")
"""A row in one of these with a certificate has one to serve (a renewal that has not
landed yet, an expired or failed one still serve what they have)."""


@dataclass(frozen=True)
class StoredCertificate:
    """What is served for one hostname, as Postgres holds it (the key encrypted)."""

    hostname: str
    serial: str
    leaf_pem: str
    chain_pem: str
    encrypted_key: bytes


_SELECT = """
    SELECT hostname::text AS hostname, ssl_serial, ssl_certificate, ssl_certificate_chain,
           encrypted_ssl_private_key
    FROM certificates
    WHERE ssl_certificate IS NOT NULL AND status = ANY($1::text[])
"""


def _stored(row: asyncpg.Record) -> StoredCertificate:
    return StoredCertificate(
        hostname=row["hostname"],
        serial=row["ssl_serial"],
        leaf_pem=row["ssl_certificate"],
        chain_pem=row["ssl_certificate_chain"] or "",
        encrypted_key=bytes(row["encrypted_ssl_private_key"]),
    )


async def served_certificate(pool: asyncpg.Pool, hostname: str) -> StoredCertificate | None:
    """hostname's current certificate, if it has one to serve."""
    row = await pool.fetchrow(_SELECT + " AND hostname = $2", list(SERVED_STATUSES), hostname)
    return None if row is None else _stored(row)


async def served_page(pool: asyncpg.Pool, after: str, limit: int) -> list[StoredCertificate]:
    """Up to ``limit`` served certificates of hostnames after ``after``, in the order of
    the hostname's unique index (keyset pages)."""
    rows = await pool.fetch(
        _SELECT + " AND hostname > $2::citext ORDER BY hostname LIMIT $3",
        list(SERVED_STATUSES),
        after,
        limit,
    )
    return [_stored(row) for row in rows]


async def served_certificates(pool: asyncpg.Pool, hostnames: Sequence[str]) -> list[StoredCertificate]:
    """The served certificates of these hostnames (those with none are left out)."""
    rows = await pool.fetch(
        _SELECT + " AND hostname = ANY($2::citext[])", list(SERVED_STATUSES), list(hostnames)
    )
    return [_stored(row) for row in rows]


async def count_by_status(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, int]:
    """How many certificates are in each status (read once at start: the metrics
    follow the event log after that)."""
    rows = await conn.fetch("SELECT status, count(*) AS n FROM certificates GROUP BY status")
    return {r["status"]: int(r["n"]) for r in rows}


@dataclass(frozen=True)
class Horizon:
    """The soonest expiry of a certificate in use, and the latest end of a cooldown."""

    soonest_expiry: datetime | None
    cooldown_until: datetime | None


async def horizon(pool: asyncpg.Pool) -> Horizon:
    """Two indexed reads (min of ``ssl_expires_at``, max of a cooldown's end)."""
    row = await pool.fetchrow(
        """
        SELECT
            (SELECT min(ssl_expires_at) FROM certificates
               WHERE status IN ('ACTIVE', 'RENEWING')) AS soonest,
            (SELECT max(until) FROM acme_cooldowns) AS cooldown_until
        """
    )
    assert row is not None
    return Horizon(row["soonest"], row["cooldown_until"])
