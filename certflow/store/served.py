"""The certificates a TLS edge serves, as Postgres holds them (the key encrypted),
and the figures the metrics refresh reads: every read keyset-paged or indexed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg

SERVED_STATUSES = ("ACTIVE", "RENEWING", "FAILED", "CANCELED")
"""A row in one of these with a certificate that has not expired has one to serve:
a renewal that has not landed yet, a failed one and a canceled one serve what they
have until it expires (a transferred one too, until its new certificate is stored)."""


@dataclass(frozen=True)
class StoredCertificate:
    """What is served for one hostname, as Postgres holds it (the key encrypted)."""

    hostname: str
    serial: str
    leaf_pem: str
    chain_pem: str
    encrypted_key: bytes
    expires_at: datetime | None = None
    """When it stops being served (the leaf's notAfter, as stored)."""


_SELECT = """
    SELECT hostname::text AS hostname, ssl_serial, ssl_certificate, ssl_certificate_chain,
           encrypted_ssl_private_key, ssl_expires_at
    FROM certificates
    WHERE ssl_certificate IS NOT NULL AND status = ANY($1::text[])
      AND (ssl_expires_at IS NULL OR ssl_expires_at > now())
"""


def _stored(row: asyncpg.Record) -> StoredCertificate:
    return StoredCertificate(
        hostname=row["hostname"],
        serial=row["ssl_serial"],
        leaf_pem=row["ssl_certificate"],
        chain_pem=row["ssl_certificate_chain"] or "",
        encrypted_key=bytes(row["encrypted_ssl_private_key"]),
        expires_at=row["ssl_expires_at"],
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


COOLDOWN_SCOPES = ("account", "registered_domain", "hostname")


@dataclass(frozen=True)
class Horizon:
    """The soonest expiry of a certificate in use, the latest end of a cooldown, the
    certificates in use expiring soon by status, and the cooldowns in force by scope."""

    soonest_expiry: datetime | None
    cooldown_until: datetime | None
    expiring_soon: dict[str, int] = field(default_factory=dict)
    """ACTIVE (no renewal in progress) and RENEWING certificates whose not_after is
    within the window asked for."""
    cooldowns_by_scope: dict[str, int] = field(default_factory=dict)


async def horizon(pool: asyncpg.Pool, expiring_within: timedelta = timedelta(days=7)) -> Horizon:
    """One statement of indexed reads: min of ``ssl_expires_at`` and the rows expiring
    within ``expiring_within`` (both on ``certificates_soonest_expiry``), and the
    cooldowns (a small table; ``acme_cooldowns_until``)."""
    row = await pool.fetchrow(
        """
        WITH soon AS (
            SELECT count(*) FILTER (WHERE status = 'ACTIVE') AS active,
                   count(*) FILTER (WHERE status = 'RENEWING') AS renewing
            FROM certificates
            WHERE status IN ('ACTIVE', 'RENEWING') AND ssl_expires_at < now() + $1::interval
        ), cooling AS (
            SELECT count(*) FILTER (WHERE scope = 'account') AS account,
                   count(*) FILTER (WHERE scope = 'registered_domain') AS registered_domain,
                   count(*) FILTER (WHERE scope = 'hostname') AS hostname
            FROM acme_cooldowns WHERE until > now()
        )
        SELECT
            (SELECT min(ssl_expires_at) FROM certificates
               WHERE status IN ('ACTIVE', 'RENEWING')) AS soonest,
            (SELECT max(until) FROM acme_cooldowns) AS cooldown_until,
            soon.active, soon.renewing,
            cooling.account, cooling.registered_domain, cooling.hostname
        FROM soon, cooling
        """,
        expiring_within,
    )
    assert row is not None
    return Horizon(
        row["soonest"],
        row["cooldown_until"],
        {"ACTIVE": int(row["active"]), "RENEWING": int(row["renewing"])},
        {scope: int(row[scope]) for scope in COOLDOWN_SCOPES},
    )
