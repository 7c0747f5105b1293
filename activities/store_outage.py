"""Every activity's Postgres outage, typed at the Temporal boundary.

While Postgres is away asyncpg raises connection errors from whichever statement
an activity was at. Untyped, a CA step's last try would reach the workflow as a
plain crash and be charged to the certificate's failure budget (ACME_TEMPORARY),
so three restarts of our own database during attempts could make it FAILED.
Typed here as StoreUnavailableError — retried as a short fault, then recorded
but not charged, as a lost worker is (``workflows/steps.py: failure_of``).
"""

from __future__ import annotations

from typing import Any

from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from certflow.errors import StoreUnavailableError, to_application_error
from certflow.store.db import store_unavailable


class StoreOutageInterceptor(Interceptor):
    """Turns a Postgres outage met by any activity into StoreUnavailableError."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TypedOutage(next)


class _TypedOutage(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except Exception as exc:
            if not store_unavailable(exc):
                raise
            outage = StoreUnavailableError(
                message=f"Postgres did not answer: {type(exc).__name__}: {exc}"
            )
            raise to_application_error(outage) from None
