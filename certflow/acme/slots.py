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
from certflow.store import cooldowns, order_slots

_FIRST_WAIT = 0.02
_MAX_WAIT = 0.5


class NoOrderSlotError(CertflowError, TimeoutError):
    """Every slot stayed taken for the whole wait."""


@dataclass
class OrderSlot:
    """A slot held: its number, whether its holder had to wait for it, and the
    session that holds it: a statement run there may let go of the slot on the way
    (``order_slots.let_go``), and its caller then sets :attr:`let_go`."""

    number: int
    waited: bool
    connection: asyncpg.Connection
    directory_url: str
    let_go: bool = False
    """Let go already: the block's end has only the connection to give back."""


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
    held = OrderSlot(int(slot), waited, conn, directory_url)
    try:
        yield held
    finally:
        try:
            if not held.let_go:
                await _unlock(conn, directory_url, slot)
        finally:
            await pool.release(conn)


async def _try(
    conn: asyncpg.Connection, directory_url: str, slots: int, held_back: HeldBack | None
) -> int | None:
    """One statement tries the slots in turn and stops at the first it gets; with
    ``held_back`` it reads the cooldowns too, and a slot taken while one holds is
    let go before ``refuse`` raises."""
    if held_back is None:
        slot: int | None = await conn.fetchval(
            f"SELECT {order_slots.take_slot('$1', '$2')}", directory_url, slots
        )
        return slot
    slot, holding = await cooldowns.try_order_slot(
        conn, directory_url, slots, held_back.hostname, held_back.registered_domain, held_back.kind
    )
    if holding:
        if slot is not None:
            await _unlock(conn, directory_url, slot)
        held_back.refuse(holding)
    return slot


async def _unlock(conn: asyncpg.Connection, directory_url: str, slot: int) -> None:
    await conn.execute(f"SELECT {order_slots.let_go('$1', '$2')}", directory_url, slot)
