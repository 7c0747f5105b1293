"""The order's validation as one activity: the self-check of the challenge, the
accept and the fast poll, where the workflow scheduled two (check_http01, then
wait_for_order): one workflow task and six history events fewer per certificate.
In runs of the order-in-one-step design the order is placed in that activity too
(``order_and_validate``): six events fewer again. Each durable effect is
committed before the next side effect (the challenge persisted before the
accept; the accept's answer in a heartbeat), so a retry resumes where the last
try stopped: the order it persisted, never a second accept.

Finalize stays an activity of its own: a cancel that arrives while the order is
polled must stop the attempt before anything is issued, and only the workflow
knows of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity

from activities.acme import AcmeActivities
from activities.preflight import PreflightActivities
from certflow.acme.validation import accepted_before
from certflow.activity_payloads import (
    Http01CheckInput,
    OrderAndValidateInput,
    OrderedAndValidated,
    OrderProgress,
    PlacedOrder,
    ValidateOrderInput,
    WaitForOrderInput,
)
from certflow.models import ValidationMethod

HEARTBEAT_EVERY = 4.0
"""Within the step's 10 s heartbeat timeout while the self-check (up to 20 s, no
heartbeat of its own) runs."""


@asynccontextmanager
async def heartbeating(*details: Any, every: float = HEARTBEAT_EVERY) -> AsyncIterator[None]:
    """Heartbeat ``details`` every ``every`` seconds while the block runs."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            activity.heartbeat(*details)

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

    @activity.defn(name="order_and_validate")
    async def order_and_validate(self, input: OrderAndValidateInput) -> OrderedAndValidated:
        """Place the order and persist its challenge (``place_order``: a retry
        resumes the order an earlier try persisted), then self-check, accept and
        poll it (``validate_order``). A dns-01 challenge stops after placing: its
        TXT is published first. Errors are those steps' own."""
        # Waiting for an order slot can outlast the heartbeat timeout; an earlier
        # try's record of an answered accept is kept.
        async with heartbeating(*activity.info().heartbeat_details):
            placed = await self._acme.place_order(input.order)
        validation = validation_of(input, placed)
        if validation is None:
            return OrderedAndValidated(order=placed)
        return OrderedAndValidated(order=placed, progress=await self.validate_order(validation))


def validation_of(input: OrderAndValidateInput, placed: PlacedOrder) -> ValidateOrderInput | None:
    """validate_order's work for the order ``order_and_validate`` placed; None for a
    dns-01 challenge (its TXT is published before the accept)."""
    if placed.method is ValidationMethod.DNS_01 and not placed.authorized:
        return None
    return ValidateOrderInput(
        wait=WaitForOrderInput(
            order_url=placed.order_url,
            challenge_url=placed.challenge_url,
            within_seconds=input.within_seconds,
            # A reused valid authorization: nothing to fetch or accept, only the order to read.
            accept_first=not placed.authorized,
            issuer=input.order.issuer,
        ),
        certificate_id=input.order.certificate_id,
        hostname=input.order.hostname,
        self_check=input.self_check
        and not placed.authorized
        and placed.method in (None, ValidationMethod.HTTP_01),
        token=placed.token,
        key_authorization=placed.key_authorization,
    )
