"""Asking one CA to validate a challenge, once, and following the order until it
is ready (accept_challenge, wait_for_order): a second accept would start a second
validation, and each failed one counts against the account.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from acme import challenges, messages
from acme import client as acme_client
from temporalio import activity

from certflow.acme.exchange import FAST_POLL_FIRST, FAST_POLL_MAX, IssuerExchange
from certflow.acme.problems import challenge_failure
from certflow.acme.refusals import problem_suffix
from certflow.activity_payloads import OrderProgress, WaitForOrderInput
from certflow.errors import AcmeProblemError, ErrorCode
from certflow.models import ISSUABLE, AcmeStatus


def _order_status(order: dict[str, Any]) -> AcmeStatus:
    try:
        return AcmeStatus(str(order.get("status")))
    except ValueError:
        raise AcmeProblemError(
            code=ErrorCode.ACME_TEMPORARY,
            message=f"the CA answered an order status RFC 8555 does not define: {order.get('status')!r}",
        ) from None



def accepted_before() -> bool:
    """An earlier try of the running activity had its accept answered (its
    heartbeat says so)."""
    details = activity.info().heartbeat_details
    return bool(details and isinstance(details[0], dict) and details[0].get("accepted"))

class OrderValidation:
    """accept_challenge and wait_for_order at one CA."""

    def __init__(self, ca: IssuerExchange) -> None:
        self._ca = ca

    # -- accept_challenge --------------------------------------------------

    async def accept(self, challenge_url: str) -> None:
        await self._ca.call(lambda client: self._accept(client, challenge_url))

    def _accept(self, client: acme_client.ClientV2, challenge_url: str) -> str | None:
        """POST the challenge; the status the CA gave it in the answer."""
        try:
            response = client.net.post(
                challenge_url,
                challenges.HTTP01Response(),
                new_nonce_url=self._ca.clients.new_nonce_url,
            )
        except messages.Error as err:
            if problem_suffix(str(err.typ)) == "conflict":
                # Boulder with SetAuthzProcessing (config-next since 2026-07, ra.go
                # PerformValidation): 409 "Authorization is already being validated" to
                # an accept while an earlier one validates; the authorization still
                # reads pending. The CA has the accept: follow the order.
                return AcmeStatus.PROCESSING
            # Pebble answers `malformed` to a second accept; only the status tells.
            challenge = self._ca.post_as_get(client, challenge_url).body
            if challenge.get("status") == AcmeStatus.INVALID:
                # Table 2: caa → ACME_CAA, rejectedIdentifier → ACME_REJECTED, a failed
                # validation → ACME_INVALID_ORDER, each with the CA's detail.
                raise challenge_failure(challenge.get("error"), "challenge invalid") from None
            if challenge.get("status") not in (AcmeStatus.PROCESSING, AcmeStatus.VALID):
                raise
            return str(challenge["status"])
        try:
            body = response.json()
        except ValueError:
            return None
        return str(body.get("status")) if isinstance(body, dict) else None

    # -- wait_for_order ----------------------------------------------------

    async def follow(self, input: WaitForOrderInput) -> OrderProgress:
        accepted, validating = await self._accept_once(input)
        try:
            return await self._poll_until_issuable(input, accepted, validating)
        except AcmeProblemError as err:
            err.accepted = err.accepted or accepted
            raise

    async def _accept_once(self, input: WaitForOrderInput) -> tuple[bool, bool]:
        """Ask the CA to validate, once: never again once it answered an accept
        (Boulder starts a second validation for a second POST, and counts each
        failure: ra.go PerformValidation). Whether this activity's earlier try got
        an answer is in its heartbeat; a kept order (``accept_unsure``) or a retry
        without one reads the challenge first and POSTs only while it is pending.
        Returns whether the accept was answered (by this call or before), and
        whether this call's answer left the challenge still to be validated."""
        if not input.accept_first or not input.challenge_url:
            return False, False
        if accepted_before():
            return True, False
        url = input.challenge_url
        if input.accept_unsure or activity.info().attempt > 1:
            challenge = await self._ca.call(lambda client: self._ca.post_as_get(client, url), poll=True)
            if challenge.body.get("status") != AcmeStatus.PENDING:
                return True, False  # answered before: validating, or done
        status = await self._ca.call(lambda client: self._accept(client, url))
        activity.heartbeat({"accepted": True})
        return True, status in (AcmeStatus.PENDING, AcmeStatus.PROCESSING)

    async def _poll_until_issuable(
        self, input: WaitForOrderInput, accepted: bool, validating: bool
    ) -> OrderProgress:
        """Poll fast until the order is ready or valid, or the window ends; never
        POST the challenge again (docs/lifecycle.md, "How a certificate runs"). ``validating``: the accept was
        just answered with the challenge still to be validated, so the first poll
        waits one interval — the CA's validator has yet to fetch the challenge from
        us, and asking at once would only read the pending order again."""
        deadline = time.monotonic() + input.within_seconds
        interval = FAST_POLL_FIRST
        if validating:
            await asyncio.sleep(min(interval, input.within_seconds))
        while True:
            fetched = await self._ca.poll(input.order_url)
            # A retry of this activity must know the accept was answered.
            activity.heartbeat(*([{"accepted": True}] if accepted else []))
            status = _order_status(fetched.body)
            if status in ISSUABLE:
                return OrderProgress(status=status)
            if status is AcmeStatus.INVALID:
                raise await self._ca.invalid_order(fetched.body)
            now = time.monotonic()
            # The CA's pacing wins: a Retry-After beyond the window ends it early.
            wait = max(interval, fetched.retry_after or 0.0)
            if now >= deadline or now + wait > deadline and fetched.retry_after:
                if accepted and status is AcmeStatus.PENDING:
                    await self._raise_if_authorization_failed(fetched.body)
                return OrderProgress(status=status, retry_after_seconds=fetched.retry_after)
            await asyncio.sleep(min(wait, max(0.0, deadline - now)))
            interval = min(interval * 1.5, FAST_POLL_MAX)

    async def _raise_if_authorization_failed(self, order: dict[str, Any]) -> None:
        """An order still pending after its challenge was answered, whose
        authorization is invalid, is invalid (RFC 8555 §7.1.6), whether or not the CA
        says so yet (acme2certifier 0.46 leaves such an order pending for ever)."""
        for url in list(order.get("authorizations") or []):
            authz = await self._ca.call(lambda client: self._ca.post_as_get(client, url), poll=True)
            if authz.body.get("status") == AcmeStatus.INVALID:
                raise await self._ca.invalid_order({**order, "authorizations": [url]})
