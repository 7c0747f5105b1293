"""Postgres work done for one database: pg_stat_statements calls when the
extension is loaded, and pg_stat_database transaction and tuple counters always.

Both are read from the bench's own stats database, so reading them adds
nothing to the measured database. Queries the bench itself sends to the
measured database carry the ``/* bench */`` tag and are left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import asyncpg

BENCH_TAG = "/* bench */"
_DATABASE_COUNTERS = (
    "xact_commit",
    "xact_rollback",
    "tup_returned",
    "tup_fetched",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
)


@dataclass
class PgSnapshot:
    at: float
    counters: dict[str, int]
    calls: dict[str, int] | None = None
    """Normalized statement text -> calls, or None without pg_stat_statements."""


@dataclass
class PgDelta:
    seconds: float
    counters: dict[str, int]
    statements: int | None
    by_statement: dict[str, int] = field(default_factory=dict)

    def per(self, count: int, top: int = 25) -> dict[str, object]:
        """This delta divided by ``count`` (certificates), with the top statements."""
        ranked = sorted(self.by_statement.items(), key=lambda kv: -kv[1])[:top]
        return {
            "statements": None if self.statements is None else round(self.statements / count, 2),
            "xact_commit": round(self.counters["xact_commit"] / count, 2),
            "tup_inserted": round(self.counters["tup_inserted"] / count, 2),
            "tup_updated": round(self.counters["tup_updated"] / count, 2),
            "top_statements": [
                {"calls_per_cert": round(calls / count, 2), "statement": _short(text)}
                for text, calls in ranked
            ],
        }


def _short(text: str, limit: int = 140) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class PgStats:
    """Snapshots of one database's counters through a connection to the stats database."""

    def __init__(self, conn: asyncpg.Connection, statements: bool) -> None:
        self._conn = conn
        self.statements = statements

    @classmethod
    async def connect(cls, stats_url: str, statements: bool) -> PgStats:
        return cls(await asyncpg.connect(stats_url), statements)

    async def close(self) -> None:
        await self._conn.close()

    async def snapshot(self, database: str) -> PgSnapshot:
        row = await self._conn.fetchrow(
            f"SELECT {', '.join(_DATABASE_COUNTERS)} FROM pg_stat_database WHERE datname = $1",
            database,
        )
        counters = {name: int(row[name] or 0) for name in _DATABASE_COUNTERS} if row else {
            name: 0 for name in _DATABASE_COUNTERS
        }
        calls = None
        if self.statements:
            rows = await self._conn.fetch(
                """SELECT s.query, sum(s.calls)::bigint AS calls
                   FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                   WHERE d.datname = $1 AND s.toplevel AND s.query NOT LIKE $2
                   GROUP BY s.query""",
                database,
                f"%{BENCH_TAG}%",
            )
            calls = {r["query"]: int(r["calls"]) for r in rows}
        return PgSnapshot(time.monotonic(), counters, calls)


def delta(before: PgSnapshot, after: PgSnapshot, bench_transactions: int = 0) -> PgDelta:
    """after - before; ``bench_transactions`` (the bench's own tagged queries on the
    measured database) are taken off xact_commit."""
    counters = {k: after.counters[k] - before.counters.get(k, 0) for k in after.counters}
    counters["xact_commit"] = max(0, counters["xact_commit"] - bench_transactions)
    if after.calls is None or before.calls is None:
        return PgDelta(after.at - before.at, counters, None)
    by_statement = {
        text: calls - before.calls.get(text, 0)
        for text, calls in after.calls.items()
        if calls - before.calls.get(text, 0) > 0
    }
    return PgDelta(after.at - before.at, counters, sum(by_statement.values()), by_statement)
