"""How each scheduled pass ended, for the alert that pages when reconcile or the
renewal-info sweep keeps failing: ``certflow_scheduled_pass_total{pass, result}``
on the worker's /metrics (with the SDK's activity labels), counted through the
activity's own meter (a no-op without CERTFLOW_METRICS_LISTEN)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity

PASS_COUNTER = "certflow_scheduled_pass_total"


@asynccontextmanager
async def counted_pass(name: str) -> AsyncIterator[None]:
    """Count the pass ``name`` as ``ok`` when the block returns, ``error`` when it
    raises (cancellation by a missed heartbeat included)."""
    counter = activity.metric_meter().create_counter(
        PASS_COUNTER, "Scheduled passes (reconcile, renewal_info_sweep) by result"
    )
    try:
        yield
    except BaseException:
        counter.add(1, {"pass": name, "result": "error"})
        raise
    counter.add(1, {"pass": name, "result": "ok"})
