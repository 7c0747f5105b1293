"""How fast a worker polls the CA: one token bucket for every fast poll of the
process (orders and authorizations), well under Let's Encrypt's per-IP limits,
however many certificates are in flight."""

from __future__ import annotations

import asyncio
import time


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
