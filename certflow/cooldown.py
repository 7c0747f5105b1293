"""The CA rate-limit cooldown, shared by every worker through Postgres.

While it runs no worker creates a new order; it only ever extends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg


@dataclass(frozen=True)
class Cooldown:
    directory_url: str
    until: datetime
    problem_type: str | None
    detail: str | None


async def active_cooldown(pool: asyncpg.Pool, directory_url: str) -> Cooldown | None:
    row = await pool.fetchrow(
        "SELECT directory_url, until, problem_type, detail FROM acme_cooldowns"
        " WHERE directory_url = $1 AND until > now()",
        directory_url,
    )
    return Cooldown(**dict(row)) if row is not None else None


async def extend_cooldown(
    pool: asyncpg.Pool,
    directory_url: str,
    seconds: float,
    problem_type: str | None,
    detail: str | None,
) -> datetime:
    """Start or lengthen the cooldown to now + seconds; returns its end."""
    until = await pool.fetchval(
        """
        INSERT INTO acme_cooldowns (directory_url, until, problem_type, detail)
        VALUES ($1, now() + make_interval(secs => $2), $3, $4)
        ON CONFLICT (directory_url) DO UPDATE SET
            until = greatest(acme_cooldowns.until, EXCLUDED.until),
            problem_type = EXCLUDED.problem_type, detail = EXCLUDED.detail, updated_at = now()
        RETURNING until
        """,
        directory_url,
        float(seconds),
        problem_type,
        detail,
    )
    assert isinstance(until, datetime)
    return until


async def clear_cooldown(pool: asyncpg.Pool, directory_url: str) -> bool:
    result = await pool.fetchval(
        "DELETE FROM acme_cooldowns WHERE directory_url = $1 RETURNING true", directory_url
    )
    return bool(result)


async def active_cooldowns(pool: asyncpg.Pool) -> list[Cooldown]:
    """Every cooldown in force, whatever the CA."""
    rows = await pool.fetch(
        "SELECT directory_url, until, problem_type, detail FROM acme_cooldowns"
        " WHERE until > now() ORDER BY until DESC"
    )
    return [Cooldown(**dict(r)) for r in rows]


async def clear_all(pool: asyncpg.Pool) -> int:
    result = await pool.execute("DELETE FROM acme_cooldowns")
    return int(result.split()[-1])
