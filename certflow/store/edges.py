"""The edges ``certflow edge`` keeps current, as each reports itself (a few rows,
one per edge process): what ``status HOST`` asks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg


@dataclass(frozen=True)
class EdgeRecord:
    """One edge process, as it last reported."""

    name: str
    kind: str
    tls_address: str | None
    """Where it serves TLS (``host:port``), for ``status`` to handshake with; None
    when it did not say."""
    started_at: datetime
    heartbeat_at: datetime
    converged_at: datetime | None
    synced_at: datetime | None
    """When it last held every change read from the feed (None: never yet)."""
    held: int
    push_failures: int


_COLUMNS = "name, kind, tls_address, started_at, heartbeat_at, converged_at, synced_at, held, push_failures"


async def record(pool: asyncpg.Pool, edge: EdgeRecord) -> None:
    """Write this edge's report over its last one."""
    await pool.execute(
        f"""
        INSERT INTO edges ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind, tls_address = EXCLUDED.tls_address,
            started_at = EXCLUDED.started_at, heartbeat_at = EXCLUDED.heartbeat_at,
            converged_at = EXCLUDED.converged_at, synced_at = EXCLUDED.synced_at,
            held = EXCLUDED.held, push_failures = EXCLUDED.push_failures
        """,
        edge.name, edge.kind, edge.tls_address, edge.started_at, edge.heartbeat_at,
        edge.converged_at, edge.synced_at, edge.held, edge.push_failures,
    )


async def live_edges(pool: asyncpg.Pool, within: timedelta) -> list[EdgeRecord]:
    """The edges that reported within ``within``, by name (a gone edge's row stays,
    and is left out once it is that old)."""
    rows = await pool.fetch(
        f"SELECT {_COLUMNS} FROM edges WHERE heartbeat_at > now() - $1::interval ORDER BY name", within
    )
    return [EdgeRecord(**dict(row)) for row in rows]
