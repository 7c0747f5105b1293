"""Postgres connection pool and versioned migrations."""

from __future__ import annotations

import logging
import traceback
from importlib import resources

import asyncpg

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same for every certflow process.
MIGRATION_LOCK_ID = 0x6365727466_6C6F77 % (2**63)


async def _keep_session(_: asyncpg.Connection) -> None:
    """Return a connection to the pool as it is.

    asyncpg's default reset runs four statements (CLOSE ALL, RESET ALL, UNLISTEN *,
    pg_advisory_unlock_all) on every release, 4 of every 5 statements certflow
    sent. certflow never leaves session state behind (no SET, LISTEN, cursors;
    the one session advisory lock, in migrate(), is released explicitly).
    """


UNAVAILABLE: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # the connection broke or was never made
    asyncpg.CannotConnectNowError,  # starting up or shutting down
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
)
"""What asyncpg raises while Postgres is away, as opposed to an error in a statement."""


def store_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says Postgres did not answer (not that a statement failed): one
    of asyncpg's own, or an OS error (refused, reset, no socket file, a connect
    timeout) raised through asyncpg, as its connect raises them."""
    if isinstance(exc, UNAVAILABLE):
        return True
    return isinstance(exc, OSError) and any(
        frame.f_globals.get("__name__", "").startswith("asyncpg.")
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    )


async def create_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, timeout: float = 60.0
) -> asyncpg.Pool:
    """A pool whose connections are checked before use, so a restarted Postgres is
    survived; ``timeout`` bounds each connection attempt (asyncpg's default: 60 s)."""
    pool = await asyncpg.create_pool(
        url,
        min_size=min_size,
        max_size=max_size,
        command_timeout=30,
        max_inactive_connection_lifetime=300,
        reset=_keep_session,
        timeout=timeout,
    )
    assert pool is not None
    return pool


def _migrations() -> list[tuple[int, str, str]]:
    files = resources.files("certflow.store") / "migrations"
    found = []
    for entry in files.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text()))
    return sorted(found)


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply pending migrations once; concurrent callers wait on an advisory lock."""
    applied: list[str] = []
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)
        try:
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version integer PRIMARY KEY,
                       name text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in _migrations():
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                        version,
                        name,
                    )
                log.info("applied migration %s", name)
                applied.append(name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
    return applied
