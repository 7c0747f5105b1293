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

from certflow.acme.slots import order_slot
from certflow.store.db import create_pool

pytestmark = pytest.mark.e2e

DIRECTORY = "https://ca.test/directory"


async def test_waiters_for_a_slot_leave_the_pool_to_others(new_database: Callable[[], str]) -> None:
    pool = await create_pool(new_database(), max_size=2)
    holding = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with order_slot(pool, DIRECTORY, 1, timeout=30):
            holding.set()
            await release.wait()

    async def waiter() -> bool:
        async with order_slot(pool, DIRECTORY, 1, timeout=30) as slot:
            return slot.waited

    try:
        held = asyncio.create_task(holder())
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
