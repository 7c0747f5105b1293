"""CA rate-limit cooldowns, shared by every worker through Postgres (docs/rate-limits.md).

A rate-limit answer records a cooldown for the scope the CA's limit applies to
(the account, one registered domain, one hostname) and the limit's name; while
it runs no worker sends a new order in that scope, unless the order is exempt
from that limit (renewals, :func:`holds`). A cooldown only ever extends.
"""

from __future__ import annotations

import json

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from certflow.hostnames import Hostname, registered_domain
from certflow.models import Cooldown, LimitScope, OrderKind
from certflow.store import order_slots
from certflow.store.attempts import order_kind


OVERALL_REQUESTS = "OverallRequests"
"""The load balancers' 503 with Retry-After: holds every request, renewals too."""
RENEWAL_EXEMPT = frozenset({"NewOrdersPerAccount", "CertificatesPerDomain"})


def holds(limit_name: str, kind: OrderKind) -> bool:
    """Whether a cooldown of this limit holds back an order of this kind."""
    if kind is OrderKind.ARI_RENEWAL:
        return limit_name == OVERALL_REQUESTS
    if kind is OrderKind.RENEWAL:
        return limit_name not in RENEWAL_EXEMPT
    return True


_COLUMNS = "directory_url, scope, scope_key, limit_name, until, problem_type, detail"
_IN_FORCE_FOR = """
    FROM acme_cooldowns
    WHERE directory_url = $1 AND until > now()
      AND (scope = 'account'
           OR (scope = 'registered_domain' AND scope_key = $3)
           OR (scope = 'hostname' AND scope_key = $2))
"""
"""The cooldowns in force at a CA ($1) for a hostname ($2) and its registered domain ($3)."""


def _cooldown(row: asyncpg.Record) -> Cooldown:
    return Cooldown(**dict(row))


async def applicable_cooldowns(
    pool: asyncpg.Pool,
    directory_url: str,
    hostname: str,
    registered_domain: str,
    kind: OrderKind = OrderKind.NEW,
) -> list[Cooldown]:
    """The cooldowns in force that hold back a new order of this kind for hostname
    (the account's, its registered domain's, its own), longest first."""
    rows = await pool.fetch(
        f"SELECT {_COLUMNS} {_IN_FORCE_FOR} ORDER BY until DESC",
        directory_url,
        hostname,
        registered_domain,
    )
    return [c for c in map(_cooldown, rows) if holds(c.limit_name, kind)]


async def try_order_slot(
    conn: asyncpg.Connection,
    directory_url: str,
    slots: int,
    hostname: str,
    registered_domain: str,
    kind: OrderKind,
) -> tuple[int | None, list[Cooldown]]:
    """One try at one of the account's new-order slots (a session advisory lock
    held by ``conn``: certflow/acme/slots.py), in the statement that reads the
    cooldowns in force that hold back this kind of order for hostname: the slot
    taken (None: all taken) and those cooldowns, longest first. A slot taken while
    one holds is the caller's to let go.

    The same statement marks hostname's row as having had a workflow run, once: the
    first write of a run that took its row from the request (reconcile's cue)."""
    row = await conn.fetchrow(
        f"""
        WITH seen AS (
            UPDATE certificates SET workflow_seen_at = now()
            WHERE hostname = $2::citext AND workflow_seen_at IS NULL
            RETURNING 1
        )
        SELECT {order_slots.take_slot("$1", "$4")} AS slot,
               (SELECT coalesce(json_agg(c ORDER BY c.until DESC), '[]')
                FROM (SELECT {_COLUMNS} {_IN_FORCE_FOR}) AS c) AS cooldowns
        """,
        directory_url,
        hostname,
        registered_domain,
        slots,
    )
    found = [Cooldown.model_validate(c) for c in json.loads(row["cooldowns"])]
    return row["slot"], [c for c in found if holds(c.limit_name, kind)]


async def extend_cooldown(
    pool: asyncpg.Pool,
    directory_url: str,
    scope: LimitScope,
    scope_key: str,
    limit_name: str,
    seconds: float,
    problem_type: str | None,
    detail: str | None,
) -> datetime:
    """Start or lengthen a cooldown to now + seconds; returns its end."""
    until = await pool.fetchval(
        """
        INSERT INTO acme_cooldowns
            (directory_url, scope, scope_key, limit_name, until, problem_type, detail)
        VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6, $7)
        ON CONFLICT (directory_url, scope, scope_key, limit_name) DO UPDATE SET
            until = greatest(acme_cooldowns.until, EXCLUDED.until),
            problem_type = EXCLUDED.problem_type, detail = EXCLUDED.detail, updated_at = now()
        RETURNING until
        """,
        directory_url,
        str(scope),
        scope_key,
        limit_name,
        float(seconds),
        problem_type,
        detail,
    )
    assert isinstance(until, datetime)
    return until


async def active_cooldowns(pool: asyncpg.Pool) -> list[Cooldown]:
    """Every cooldown in force, whatever the CA and scope, longest first."""
    rows = await pool.fetch(
        f"SELECT {_COLUMNS} FROM acme_cooldowns WHERE until > now() ORDER BY until DESC"
    )
    return [_cooldown(r) for r in rows]


async def clear_cooldowns(
    pool: asyncpg.Pool, scope: LimitScope | None = None, scope_key: str | None = None
) -> list[Cooldown]:
    """End the cooldowns in force (of one scope, and one key in it, when given);
    returns those that were ended."""
    rows = await pool.fetch(
        f"""
        DELETE FROM acme_cooldowns
        WHERE until > now() AND ($1::text IS NULL OR scope = $1)
          AND ($2::text IS NULL OR scope_key = $2)
        RETURNING {_COLUMNS}
        """,
        str(scope) if scope is not None else None,
        scope_key,
    )
    return [_cooldown(r) for r in rows]


def longest(cooldowns: Sequence[Cooldown]) -> Cooldown | None:
    return max(cooldowns, key=lambda c: c.until, default=None)


async def holding_back(pool: asyncpg.Pool, hostname: Hostname) -> list[Cooldown]:
    """The cooldowns in force, at any CA, that hold back hostname's next order: the
    account's, its registered domain's, its own (less those its renewal is exempt
    from), longest first."""
    kind = await order_kind(pool, hostname)
    found: list[Cooldown] = []
    for directory_url in {c.directory_url for c in await active_cooldowns(pool)}:
        found += await applicable_cooldowns(
            pool, directory_url, hostname, registered_domain(hostname), kind
        )
    return sorted(found, key=lambda c: c.until, reverse=True)


def held_back(hostname: str, cleared: Sequence[Cooldown]) -> bool:
    """Whether any of these cooldowns was one that held hostname back."""
    return any(
        c.scope is LimitScope.ACCOUNT
        or (c.scope is LimitScope.HOSTNAME and c.scope_key == hostname)
        or (c.scope is LimitScope.REGISTERED_DOMAIN and c.scope_key == registered_domain(hostname))
        for c in cleared
    )
