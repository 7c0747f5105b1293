"""The ACME activities: each sends its step to the CA its input or its row names
(certflow/acme/router.py picks it, certflow/acme/orders.py does the exchange), in
a span, with metrics by phase and result, and typed errors out."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from temporalio import activity

from certflow.acme.router import IssuerRouter
from certflow.errors import AcmeProblemError, ProvisioningError, ErrorCode, to_application_error
from certflow.hostnames import Hostname
from certflow.metrics import CertflowMetrics
from certflow.models import ISSUABLE, OrderKind
from certflow.activity_payloads import (
    AcceptChallengeInput,
    CreateOrderInput,
    FinalizeInput,
    IssuedCertificate,
    OpenedOrder,
    OrderProgress,
    PlaceOrderInput,
    PlacedOrder,
    RenewalAdvice,
    WaitForOrderInput,
)
from certflow.store import attempts
from certflow.running.tracing import step_span

T = TypeVar("T")


class AcmeActivities:
    """The ACME activities, each sent to the issuer its input or its row names (the
    first configured one for inputs and rows from before issuers); the names each
    is registered under are pinned (histories hold them)."""

    def __init__(self, issuers: IssuerRouter, pool: asyncpg.Pool, metrics: CertflowMetrics) -> None:
        self._issuers = issuers
        self._pool = pool
        self._metrics = metrics

    async def _step(
        self,
        phase: str,
        work: Callable[[], Awaitable[T]],
        result_of: Callable[[T], str] = lambda _: "ok",
        span_attributes: dict[str, str | None] | None = None,
    ) -> T:
        """Run one activity's work in a span, with metrics by phase and result;
        typed errors out."""
        started = time.monotonic()
        try:
            with step_span(phase, **(span_attributes or {})):
                result = await work()
        except ProvisioningError as err:
            limited = err.code is ErrorCode.ACME_RATE_LIMITED
            self._metrics.step(phase, "rate_limited" if limited else "error", started)
            raise to_application_error(err) from None
        self._metrics.step(phase, result_of(result), started)
        return result

    @activity.defn(name="cooldown_remaining")
    async def cooldown_remaining(self, hostname: Hostname) -> float:
        """Seconds left of the rate-limit cooldowns that hold back the next order for
        hostname at the issuer of its attempt (0 when none): the account's, its
        registered domain's, its own, less those a renewal at the CA of its
        certificate is exempt from."""
        attempt = await attempts.attempt_issuer(self._pool, hostname)
        try:
            orders = self._issuers.at(attempt.order_issuer)
            renews_here = attempt.has_certificate and (
                self._issuers.at(attempt.certificate_issuer).ca.name == orders.ca.name
            )
        except AcmeProblemError as err:
            raise to_application_error(err) from None
        kind = OrderKind.RENEWAL if renews_here else OrderKind.NEW
        return await orders.ca.cooldown_left(hostname, kind)

    @activity.defn(name="create_order")
    async def create_order(self, input: CreateOrderInput) -> OpenedOrder:
        """Open a new order for the hostname and pick its http-01 challenge (runs
        from before the place-order patch). Nothing is sent while a rate-limit
        cooldown that applies to it holds."""
        return await self._step(
            "create_order",
            lambda: self._issuers.on(None, lambda orders: orders.new_orders.new_order(input.hostname)),
            span_attributes={"certificate.hostname": input.hostname},
        )

    @activity.defn(name="place_order")
    async def place_order(self, input: PlaceOrderInput) -> PlacedOrder:
        """Open a new order at the chosen issuer and persist its challenge, in one
        step (runs from before the place-order patch call create_order and
        persist_challenge instead).

        An order an earlier try persisted (its result lost) is returned as it is,
        never ordered again. Nothing is sent while a rate-limit cooldown that applies
        to this order holds (docs/rate-limits.md: its scope, and the exemptions of renewals).
        """
        return await self._step(
            "create_order",  # the original dashboard's phase label for this step
            lambda: self._issuers.on(input.issuer, lambda orders: orders.new_orders.place(input)),
            span_attributes={"certificate.hostname": input.hostname, "acme.issuer": input.issuer},
        )

    @activity.defn(name="accept_challenge")
    async def accept_challenge(self, input: AcceptChallengeInput) -> None:
        """Ask the CA to validate. A challenge already validating or valid is success."""
        await self._step(
            "accept_challenge",
            lambda: self._issuers.on(input.issuer, lambda orders: orders.validation.accept(input.challenge_url)),
        )

    @activity.defn(name="wait_for_order")
    async def wait_for_order(self, input: WaitForOrderInput) -> OrderProgress:
        """Poll the order every few tens of milliseconds (heartbeating) until it is
        ready or valid, or the window ends; with ``accept_first``, accept the
        challenge first. An invalid order is ACME_INVALID_ORDER."""
        return await self._step(
            "poll_order",
            lambda: self._issuers.on(input.issuer, lambda orders: orders.validation.follow(input)),
            lambda progress: "ok" if progress.status in ISSUABLE else "not_ready",
            span_attributes={"acme.order_url": input.order_url},
        )

    @activity.defn(name="finalize_and_store")
    async def finalize_and_store(self, input: FinalizeInput) -> IssuedCertificate:
        """Finalize the order with a new key stored beforehand, download the chain,
        check it matches the key, and make it the current certificate."""
        return await self._step(
            "issue_cert",  # the original dashboard's phase label for this step
            lambda: self._issuers.on(input.issuer, lambda orders: orders.finalization.finalize(input)),
            span_attributes={
                "certificate.id": input.certificate_id,
                "certificate.hostname": input.hostname,
            },
        )

    @activity.defn(name="renewal_info")
    async def renewal_info(self, certificate_id: str) -> RenewalAdvice:
        """The suggested renewal window of the current certificate from the CA that
        issued it, when its directory advertises ``renewalInfo``. Failures (503 +
        Retry-After included) only ask to re-check later; they never fail the
        certificate."""
        issuer = await attempts.certificate_issuer(self._pool, certificate_id)
        try:
            orders = self._issuers.at(issuer)
            await orders.ca.ready()
        except AcmeProblemError:
            return RenewalAdvice(recheck_after_seconds=3600)  # ask again later
        return await orders.renewal_advice(certificate_id)

    @activity.defn(name="deactivate_authorizations")
    async def deactivate_authorizations(self, order_url: str) -> None:
        """Deactivate the order's authorizations still pending or valid (best effort)."""
        try:
            orders = self._issuers.serving(order_url)
            await orders.ca.ready()
            await orders.deactivate(order_url)
        except ProvisioningError as err:
            raise to_application_error(err) from None

    @activity.defn(name="revoke_certificate")
    async def revoke_certificate(self, certificate_id: str) -> None:
        """Revoke the current certificate at the CA that issued it (already revoked
        is success)."""
        try:
            orders = self._issuers.at(await attempts.certificate_issuer(self._pool, certificate_id))
            await orders.ca.ready()
            await orders.revoke(certificate_id)
        except ProvisioningError as err:
            raise to_application_error(err) from None
