"""Heartbeats of the scheduled passes (reconcile, the renewal-info sweep): a long
pass shows it is alive, a short one sends none. Each heartbeat the server
records is a billable action, and the SDK sends an activity's first one at once,
so a pass that heartbeats after every page pays one each time its schedule fires
even when it finds nothing to do."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import activity


def heartbeat_due(since_last: float, timeout: timedelta | None) -> bool:
    """A heartbeat is due once half the heartbeat timeout has passed since the
    attempt began or since the last one, so that the next chance to send one (the
    next page, a few seconds of work) still comes before the timeout. Without a
    heartbeat timeout, never."""
    return timeout is not None and since_last >= timeout.total_seconds() / 2


def _monotonic() -> float:
    return time.monotonic()


class PassHeartbeat:
    """The heartbeats of one attempt of a pass (``clock``: seconds, monotonic)."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or _monotonic
        self._timeout = activity.info().heartbeat_timeout
        self._last = self._clock()

    def maybe(self, *details: Any) -> None:
        """Heartbeat if one is due (``heartbeat_due``)."""
        if heartbeat_due(self._clock() - self._last, self._timeout):
            self.now(*details)

    def now(self, *details: Any) -> None:
        """Heartbeat now (the SDK still throttles to 80 % of the timeout)."""
        activity.heartbeat(*details)
        self._last = self._clock()
