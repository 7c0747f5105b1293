"""The account's new-order slots (certflow/acme/slots.py) on a real Postgres: a
burst of orders waiting for a slot must not starve the pool the worker's other
statements share (the responder's reads, the challenge being persisted).

Checked: with the waiters holding their connection for the whole wait (the code
before this test) the plain statement below waited for the slot holder and this
failed; at N=50 in the bench that stall spiralled into 10 s waits for a slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import asyncpg

from certflow.acme.slots import HeldBack, order_slot
from certflow.activity_payloads import OpenedOrder
from certflow.hostnames import Hostname
from certflow.models import Cooldown, LimitScope, OrderKind
from certflow.store import certificates, cooldowns, requests
from certflow.store.db import create_pool, migrate

pytestmark = pytest.mark.e2e

DIRECTORY = "https://ca.test/directory"


async def _hold_the_slot(pool: asyncpg.Pool, holding: asyncio.Event, release: asyncio.Event) -> None:
    """Hold the account's one slot until ``release``."""
    async with order_slot(pool, DIRECTORY, 1, timeout=30):
        holding.set()
        await release.wait()


async def test_waiters_for_a_slot_leave_the_pool_to_others(new_database: Callable[[], str]) -> None:
    pool = await create_pool(new_database(), max_size=2)
    holding = asyncio.Event()
    release = asyncio.Event()

    async def waiter() -> bool:
        async with order_slot(pool, DIRECTORY, 1, timeout=30) as slot:
            return slot.waited

    try:
        held = asyncio.create_task(_hold_the_slot(pool, holding, release))
        await asyncio.wait_for(holding.wait(), 10)
        waiters = [asyncio.create_task(waiter()) for _ in range(3)]
        await asyncio.sleep(0)  # let them start trying
        # The one connection the holder does not hold stays usable.
        for _ in range(5):
            assert await asyncio.wait_for(pool.fetchval("SELECT 1"), 5) == 1
        release.set()
        await held
        assert await asyncio.wait_for(asyncio.gather(*waiters), 20) == [True, True, True]
        # Every slot was given back: one is free at once.
        async with order_slot(pool, DIRECTORY, 1, timeout=1) as slot:
            assert not slot.waited
    finally:
        release.set()
        await pool.close()


class Refused(Exception):
    pass


def _refuse(holding: list[Cooldown]) -> None:
    raise Refused([c.limit_name for c in holding])


async def test_a_cooldown_read_with_the_slot_refuses_the_order_and_frees_the_slot(
    new_database: Callable[[], str],
) -> None:
    """Each try at a slot reads the cooldowns in the same statement
    (``cooldowns.try_order_slot``): one in force for the hostname's registered
    domain refuses a new order, whether or not a slot was free, and the slot taken
    is let go at once; a renewal's exempt limit refuses nothing. A cooldown
    recorded while an order waits for a slot refuses it at its next try. Shown
    red: with ``slots._try`` not letting the slot go before ``refuse``, Postgres
    still showed the advisory lock held after the refusal."""
    pool = await create_pool(new_database(), max_size=3)
    await migrate(pool)
    new = HeldBack("a.example.com", "example.com", OrderKind.NEW, _refuse)
    renewal = HeldBack("a.example.com", "example.com", OrderKind.RENEWAL, _refuse)
    holding = asyncio.Event()
    release = asyncio.Event()

    try:
        held = asyncio.create_task(_hold_the_slot(pool, holding, release))
        await asyncio.wait_for(holding.wait(), 10)
        tried = asyncio.Event()
        waiting = asyncio.create_task(_order(pool, new, timeout=30, waiting=tried.set))
        await asyncio.wait_for(tried.wait(), 10)  # it tried, found the one slot taken, waits
        await cooldowns.extend_cooldown(
            pool, DIRECTORY, LimitScope.REGISTERED_DOMAIN, "example.com",
            "CertificatesPerDomain", 60, None, None,
        )
        with pytest.raises(Refused, match="CertificatesPerDomain"):
            await asyncio.wait_for(waiting, 10)  # at its next try, no slot needed
        release.set()
        await held
        with pytest.raises(Refused):
            await _order(pool, new, timeout=1)  # a slot is free: taken, then let go
        # Asked of Postgres: a session that kept the lock would take it again itself.
        assert await pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
        assert await _order(pool, renewal, timeout=1) is True  # exempt: the slot is free
    finally:
        release.set()
        await pool.close()


async def _order(
    pool: asyncpg.Pool, held_back: HeldBack, timeout: float, waiting: Callable[[], None] = lambda: None
) -> bool:
    async with order_slot(pool, DIRECTORY, 1, timeout=timeout, waiting=waiting, held_back=held_back):
        return True


async def test_the_challenge_persisted_on_the_slot_lets_go_of_it(new_database: Callable[[], str]) -> None:
    """place_order persists the challenge on the slot's connection, and that one
    statement lets go of the slot (``persist_challenge(let_go=…)``), also when the
    row has moved on and nothing is written; the block's end then only gives the
    connection back. Asked of Postgres inside the block. Red with the unlock left
    out of the statement: the advisory lock was still held after it."""
    pool = await create_pool(new_database(), max_size=3)
    await migrate(pool)
    hostname = Hostname("slot.example.com")
    row = (await requests.request_certificates(pool, [hostname], None)).rows[hostname]
    order = OpenedOrder(
        order_url="https://ca.test/o/1", challenge_url="https://ca.test/c/1", token="tok", key_authorization="ka"
    )
    locks = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    try:
        for order_url, written in ((order.order_url, True), ("https://ca.test/o/2", False)):
            async with order_slot(pool, DIRECTORY, 1, timeout=5) as slot:
                assert await pool.fetchval(locks) == 1
                persisted = await certificates.persist_challenge(
                    slot.connection,
                    row.certificate_id,
                    order.model_copy(update={"order_url": order_url}),
                    let_go=(slot.directory_url, slot.number),
                )
                slot.let_go = True
                assert (persisted is not None) is written
                assert await pool.fetchval(locks) == 0, "the statement kept the slot"
        assert await pool.fetchval(locks) == 0
    finally:
        await pool.close()
