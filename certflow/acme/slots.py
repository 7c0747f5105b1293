"""A bound on new orders in flight per ACME account, across every worker.

Each of the account's ``slots`` is a Postgres session advisory lock; a new-order
request is sent only while its sender holds one. A worker that dies mid-request
loses its session and so its slot: nothing to clean up.
"""

from __future__ import annotations

from certflow.errors import CertflowError
import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg

from certflow.models import Cooldown, OrderKind
from certflow.store import cooldowns

_FIRST_WAIT = 0.02
_MAX_WAIT = 0.5


class NoOrderSlotError(CertflowError, TimeoutError):
    """Every slot stayed taken for the whole wait."""


@dataclass(frozen=True)
class OrderSlot:
    """A slot held: its number, and whether its holder had to wait for it."""

    number: int
    waited: bool


@dataclass(frozen=True)
class HeldBack:
    """Whom an order is for, so that each try at a slot also reads the cooldowns
    that hold it back (certflow/store/cooldowns.py ``try_order_slot``), and what
    to do when one does: ``refuse`` raises."""

    hostname: str
    registered_domain: str
    kind: OrderKind
    refuse: Callable[[list[Cooldown]], None]


@asynccontextmanager
async def order_slot(
    pool: asyncpg.Pool,
    directory_url: str,
    slots: int,
    *,
    timeout: float,
    waiting: Callable[[], None] = lambda: None,
    held_back: HeldBack | None = None,
) -> AsyncIterator[OrderSlot]:
    """Hold one of the account's slots for the duration of the block; ``waiting``
    is called between tries (an activity heartbeats there). With ``held_back``,
    every try reads the cooldowns in the same statement, and one that holds the
    order back ends the wait (``refuse``), slot or none."""
    deadline = time.monotonic() + timeout
    delay = _FIRST_WAIT
    waited = False
    while True:
        # A connection only for each try: waiters holding theirs for the whole wait
        # took every connection of the pool in a burst of orders, and the statements
        # of the orders in flight (the responder's among them) waited behind them.
        conn = await pool.acquire()
        try:
            slot = await _try(conn, directory_url, slots, held_back)
        except BaseException:
            await pool.release(conn)
            raise
        if slot is not None:
            break
        await pool.release(conn)
        if time.monotonic() + delay > deadline:
            raise NoOrderSlotError(f"all {slots} new-order slots stayed taken for {timeout:g} s")
        waiting()
        waited = True
        await asyncio.sleep(delay)
        delay = min(delay * 2, _MAX_WAIT)
    try:
        yield OrderSlot(int(slot), waited)
    finally:
        await _let_go(pool, conn, directory_url, slot)


async def _try(
    conn: asyncpg.Connection, directory_url: str, slots: int, held_back: HeldBack | None
) -> int | None:
    """One statement tries the slots in turn and stops at the first it gets; with
    ``held_back`` it reads the cooldowns too, and a slot taken while one holds is
    let go before ``refuse`` raises."""
    if held_back is None:
        slot: int | None = await conn.fetchval(
            "SELECT s FROM generate_series(0, $2 - 1) AS s"
            " WHERE pg_try_advisory_lock(hashtext($1), s) LIMIT 1",
            directory_url,
            slots,
        )
        return slot
    slot, holding = await cooldowns.try_order_slot(
        conn, directory_url, slots, held_back.hostname, held_back.registered_domain, held_back.kind
    )
    if holding:
        if slot is not None:
            await conn.execute("SELECT pg_advisory_unlock(hashtext($1), $2)", directory_url, slot)
        held_back.refuse(holding)
    return slot


async def _let_go(pool: asyncpg.Pool, conn: asyncpg.Connection, directory_url: str, slot: int) -> None:
    try:
        await conn.execute("SELECT pg_advisory_unlock(hashtext($1), $2)", directory_url, slot)
    finally:
        await pool.release(conn)
