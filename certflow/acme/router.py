"""The configured CAs, each with its orders (``IssuerRouter``): which one an activity's
call goes to. The CAs themselves are configured in certflow/issuers.py; one
CA's orders are ``orders.IssuerOrders``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import asyncpg

from certflow.acme.account import AcmeClients
from certflow.acme.exchange import IssuerExchange
from certflow.acme.orders import IssuerOrders
from certflow.acme.pacing import OrderPacing, PollPacer
from certflow.crypto import EncryptionKey
from certflow.errors import AcmeProblemError, ErrorCode
from certflow.metrics import CertflowMetrics
from certflow.crypto import KeyType

T = TypeVar("T")


class IssuerRouter:
    """The configured CAs, in order of preference, each with its orders; finds the
    one an activity's input or row names (None: the first configured, for inputs
    and rows from before issuers)."""

    def __init__(
        self,
        issuers: AcmeClients | Sequence[AcmeClients],
        pool: asyncpg.Pool,
        encryption_key: EncryptionKey,
        key_type: KeyType,
        executor: ThreadPoolExecutor,
        metrics: CertflowMetrics,
        pacing: OrderPacing = OrderPacing(),
        managed_base_domain: str | None = None,
    ) -> None:
        listed = [issuers] if isinstance(issuers, AcmeClients) else list(issuers)
        if not listed:
            raise ValueError("at least one issuer is needed")
        polls = PollPacer(pacing.polls_per_second)  # one budget for every CA together
        self._orders = [
            IssuerOrders(
                IssuerExchange(
                    clients,
                    pool,
                    encryption_key,
                    key_type,
                    executor,
                    metrics,
                    pacing,
                    polls,
                    managed_base_domain,
                )
            )
            for clients in listed
        ]

    def at(self, name: str | None) -> IssuerOrders:
        """The issuer called ``name`` (None: the first configured)."""
        if name is None:
            return self._orders[0]
        for orders in self._orders:
            if orders.ca.name == name:
                return orders
        raise AcmeProblemError(
            code=ErrorCode.ACME_INVALID_ORDER,
            message=f"the issuer {name!r} is no longer configured on this worker",
        )

    async def on(self, name: str | None, call: Callable[[IssuerOrders], Awaitable[T]]) -> T:
        """``call`` on the issuer called ``name``, its account registered."""
        orders = self.at(name)
        await orders.ca.ready()
        return await call(orders)

    def serving(self, url: str) -> IssuerOrders:
        """The issuer whose orders are on the host of ``url`` (an order URL from a
        call that names no issuer), told by its newOrder URL; the first otherwise."""
        origin = urllib.parse.urlsplit(url)[:2]
        for orders in self._orders:
            if orders.ca.order_origin == origin:
                return orders
        return self._orders[0]
