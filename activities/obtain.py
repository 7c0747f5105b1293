"""The order's validation as one activity: the self-check of the challenge, the
accept and the fast poll, where the workflow scheduled two (check_http01, then
wait_for_order): one workflow task and six history events fewer per certificate.

Finalize stays an activity of its own: a cancel that arrives while the order is
polled must stop the attempt before anything is issued, and only the workflow
knows of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity

from activities.acme import AcmeActivities
from activities.preflight import PreflightActivities
from certflow.acme.validation import accepted_before
from certflow.activity_payloads import Http01CheckInput, OrderProgress, ValidateOrderInput

HEARTBEAT_EVERY = 4.0
"""Within the step's 10 s heartbeat timeout while the self-check (up to 20 s, no
heartbeat of its own) runs."""


@asynccontextmanager
async def heartbeating(every: float = HEARTBEAT_EVERY) -> AsyncIterator[None]:
    """Heartbeat (no details) every ``every`` seconds while the block runs."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            activity.heartbeat()

    ticker = asyncio.create_task(beat())
    try:
        yield
    finally:
        ticker.cancel()


class ObtainActivities:
    """The steps of an order the workflow runs as one."""

    def __init__(self, acme: AcmeActivities, preflight: PreflightActivities) -> None:
        self._acme = acme
        self._preflight = preflight

    @activity.defn(name="validate_order")
    async def validate_order(self, input: ValidateOrderInput) -> OrderProgress:
        """Self-check the challenge when asked (``check_http01``; not again once an
        earlier try's accept was answered), then accept it and poll the order
        (``wait_for_order``). Errors are those steps' own."""
        if input.self_check and not accepted_before():
            check = Http01CheckInput(
                certificate_id=input.certificate_id,
                hostname=input.hostname,
                token=input.token,
                key_authorization=input.key_authorization,
            )
            async with heartbeating():
                await self._preflight.check_http01(check)
        return await self._acme.wait_for_order(input.wait)
