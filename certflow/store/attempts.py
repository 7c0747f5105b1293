"""Which CA an attempt goes to, and what a renewal there replaces."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from certflow.hostnames import Hostname
from certflow.models import (
    OrderKind,
)


async def order_kind(pool: asyncpg.Pool, hostname: Hostname) -> OrderKind:
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

async def attempt_issuer(pool: asyncpg.Pool, hostname: Hostname) -> AttemptIssuer:
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
