"""How hard a worker pushes the CA: its settings (``OrderPacing``), and one token
bucket for every fast poll of the process (orders and authorizations), well under
Let's Encrypt's per-IP limits, however many certificates are in flight
(``PollPacer``). New orders in flight are counted across workers in Postgres
(``slots``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class OrderPacing:
    """How hard this worker pushes the CA (settings ``MAX_NEW_ORDERS_IN_FLIGHT``,
    ``ACME_POLLS_PER_SECOND``)."""

    max_orders_in_flight: int = 4
    """New-order requests in flight at once for the account, across every worker."""
    polls_per_second: float = 20.0
    """Order and authorization polls of this worker, all certificates together."""


class PollPacer:
    """At most ``rate`` polls a second on average, bursts of up to ``burst``."""

    def __init__(self, rate: float, burst: int | None = None) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = float(burst if burst is not None else max(1, int(rate)))
        self._tokens = self.burst
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Wait for a token (in turn: the lock keeps waiters in order)."""
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
                self._updated = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.rate)
