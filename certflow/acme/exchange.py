"""What every step of an order at one CA shares (``IssuerExchange``): its account
and client pool, blocking ``acme`` exchanges run on a thread, the CA's failures
typed, and its rate limits recorded as cooldowns of their scope.

Each step holds it as ``self._ca``: ``new_order``, ``validation``, ``finalize``;
``orders.IssuerOrders`` holds one of each.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
from acme import client as acme_client
from temporalio import activity

from certflow.acme.account import AcmeClients
from certflow.acme.network import DEFAULT_RATE_LIMIT_SECONDS, classify_acme_failure, parse_retry_after
from certflow.acme.pacing import OrderPacing, PollPacer
from certflow.acme.problems import challenge_failure
from certflow.acme.rate_limits import UNKNOWN_LIMIT
from certflow.crypto import EncryptionKey
from certflow.errors import AcmeProblemError, ErrorCode, ProvisioningError
from certflow.hostnames import registered_domain
from certflow.metrics import CertflowMetrics
from certflow.models import Cooldown, LimitScope, OrderKind
from certflow.store import cooldowns
from certflow.crypto import KeyType

T = TypeVar("T")

FAST_POLL_FIRST = 0.02
FAST_POLL_MAX = 0.25
MAX_RETRY_AFTER_SECONDS = 7 * 86400.0  # docs/rate-limits.md: a longer Retry-After is capped
PAUSED_RECHECK_SECONDS = 86400.0


def _scope_key(scope: LimitScope, hostname: str) -> str:
    if scope is LimitScope.HOSTNAME:
        return hostname
    if scope is LimitScope.REGISTERED_DOMAIN:
        return registered_domain(hostname)
    return ""


@dataclass(frozen=True)
class _Fetched:
    body: dict[str, Any]
    retry_after: float | None


class IssuerExchange:
    """One issuer (CA) with its account, as each step of an order talks to it."""

    def __init__(
        self,
        clients: AcmeClients,
        pool: asyncpg.Pool,
        encryption_key: EncryptionKey,
        key_type: KeyType,
        executor: ThreadPoolExecutor,
        metrics: CertflowMetrics,
        pacing: OrderPacing,
        polls: PollPacer,
        managed_base_domain: str | None = None,
    ) -> None:
        self.clients = clients
        self.pool = pool
        self.key = encryption_key
        self.key_type = key_type
        self.executor = executor
        self.profile = clients.issuer.profile
        self.metrics = metrics
        self.pacing = pacing
        self.polls = polls
        # For the rows its steps return: whether a row skips the DNS checks.
        self.managed_base_domain = managed_base_domain

    @property
    def name(self) -> str:
        return self.clients.issuer.name

    @property
    def directory_url(self) -> str:
        return self.clients.issuer.directory_url

    @property
    def order_origin(self) -> tuple[str, str] | None:
        """Where this CA's orders live (scheme, host:port of its newOrder URL);
        None until its account is registered."""
        if self.clients.account_url is None:
            return None
        split = urllib.parse.urlsplit(str(self.clients.account.directory_json.get("newOrder", "")))
        return (split.scheme, split.netloc)

    async def ready(self) -> None:
        """Its account registered (a CA that did not answer at start-up is asked now)."""
        await self.clients.ready()

    async def call(
        self,
        fn: Callable[[acme_client.ClientV2], T],
        *,
        hostname: str | None = None,
        poll: bool = False,
    ) -> T:
        """Run one blocking exchange with a borrowed client; CA failures become typed
        errors, a rate limit recorded as the cooldown of its scope (for ``hostname``,
        when the exchange concerns one). ``poll``: the exchange reads an existing
        order or authorization, and a 503 with Retry-After backs off that order
        alone — it sets no cooldown for new orders."""

        def run() -> T:
            with self.clients.borrow() as client:
                return fn(client)

        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, run)
        except ProvisioningError:
            raise
        except Exception as exc:
            raise await self.typed(classify_acme_failure(exc), hostname, poll) from None

    async def typed(
        self, err: AcmeProblemError, hostname: str | None = None, poll: bool = False
    ) -> AcmeProblemError:
        """Count the CA error; cap an absurd Retry-After; record a rate limit as the
        cooldown of the scope the CA's limit applies to (docs/rate-limits.md)."""
        self.metrics.acme_error(err.problem_type)
        if err.code is not ErrorCode.ACME_RATE_LIMITED:
            return err
        seconds = err.retry_after_seconds
        if seconds is None:
            # A paused hostname does not come back by waiting (only the CA's portal
            # lifts it): look again a day later, not every hour.
            seconds = PAUSED_RECHECK_SECONDS if err.paused else DEFAULT_RATE_LIMIT_SECONDS
        if seconds > MAX_RETRY_AFTER_SECONDS:
            activity.logger.warning(
                "the CA asked to wait %.0f s; waiting the 7-day cap instead",
                seconds,
                extra={"detail": err.detail, "problem_type": err.problem_type},
            )
            seconds = MAX_RETRY_AFTER_SECONDS
        err.retry_after_seconds = seconds
        scope = LimitScope(err.limit_scope or LimitScope.ACCOUNT)
        if poll and err.http_status == 503:
            return err  # the overall request rate, read on this order: back off it alone
        if scope is not LimitScope.ACCOUNT and hostname is None:
            return err  # no key for the scope: the order waits, nothing else is held
        if seconds > 0:
            until = await cooldowns.extend_cooldown(
                self.pool,
                self.directory_url,
                scope,
                _scope_key(scope, hostname or ""),
                err.limit_name or UNKNOWN_LIMIT,
                seconds,
                err.problem_type,
                err.detail,
            )
            err.retry_after_seconds = max(0.0, until.timestamp() - time.time())
            self.metrics.cooldown(until)
        return err

    def post_as_get(self, client: acme_client.ClientV2, url: str) -> _Fetched:
        response = client.net.post(url, None, new_nonce_url=self.clients.new_nonce_url)
        return _Fetched(response.json(), parse_retry_after(response.headers.get("Retry-After")))

    async def cooldown_left(self, hostname: str, kind: OrderKind) -> float:
        """Seconds left of this issuer's rate-limit cooldowns that hold back an order
        of this kind for hostname (0 when none)."""
        held = cooldowns.longest(await self.cooldowns_for(hostname, kind))
        return max(0.0, held.until.timestamp() - time.time()) if held else 0.0

    async def cooldowns_for(self, hostname: str, kind: OrderKind) -> list[Cooldown]:
        return await cooldowns.applicable_cooldowns(
            self.pool, self.directory_url, hostname, registered_domain(hostname), kind
        )

    async def invalid_order(self, order: dict[str, Any]) -> AcmeProblemError:
        """Explain an invalid order with the failed challenge's problem, when there is one."""
        problem: dict[str, Any] = dict(order.get("error") or {})
        authz_urls = list(order.get("authorizations") or [])
        if authz_urls and not problem:
            try:
                authz = await self.call(lambda client: self.post_as_get(client, authz_urls[0]))
                for chall in authz.body.get("challenges", []):
                    if chall.get("error"):
                        problem = dict(chall["error"])
                        break
            except ProvisioningError:
                pass
        return challenge_failure(problem, "the order became invalid")

    async def poll(self, url: str) -> _Fetched:
        """POST-as-GET an order (or authorization), paced with every other poll of
        this worker."""
        await self.polls.acquire()
        return await self.call(lambda client: self.post_as_get(client, url), poll=True)
