"""Webhook events from the Certificate workflow: expiring_soon during a failing
renewal, and canceled, each handed to a WebhookDelivery child (issued and
renewed are covered end to end in tests/e2e/test_webhooks.py).

Each test gets a time-skipping server of its own: a WebhookDelivery child is
abandoned by design (it outlives its parent), and on the shared server its
timers would keep later tests' time skipping busy."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from certflow.contract import CERTIFICATE_WORKFLOW
from certflow.workflow_payloads import CertificateInput, CertificateState, WebhookEvent
from tests.workflows.fakes import (
    FAST_POLICY,
    HOSTNAME,
    Fakes,
    Run,
    acme_temporary_error,
    active_row,
)
from workflows.certificate import CertificateWorkflow
from tests.workflows.conftest import find_test_server
from workflows.webhooks import WebhookDeliveryWorkflow


@pytest_asyncio.fixture
async def own_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_test_server(), data_converter=pydantic_data_converter
    )
    try:
        yield env
    finally:
        await env.shutdown()


async def test_expiring_soon_is_sent_once_when_renewal_keeps_failing(
    own_env: WorkflowEnvironment,
) -> None:
    """Checked: with the fake delivery of ``canceled`` slowed by 0.5 s, the old
    reading right after the parent's cancel failed as in CI (``['expiring_soon']``);
    waiting for the deliveries passes."""
    t0 = await own_env.get_current_time()
    lifetime = timedelta(days=6)  # renewal at day 3; "expiring soon" from day 4
    policy = FAST_POLICY.model_copy(
        update={
            "webhooks": True,
            "expiring_soon_days": 2,
            "failure_backoff_initial_seconds": 12 * 3600,
            "failure_backoff_max_seconds": 24 * 3600,
            "max_failures": 10,
        }
    )
    async def finalize(_: int, __: Any) -> Any:
        raise acme_temporary_error()  # the CA keeps failing this renewal

    fakes = Fakes(
        own_env,
        row=active_row(t0, lifetime),
        lifetime=lifetime,
        policy=policy,
        behaviours={"finalize_and_store": finalize},
    )
    fakes.row.tenant_id = "t-1"
    delivered: list[tuple[WebhookEvent, Any]] = []

    @activity.defn(name="deliver_webhook")
    async def deliver_webhook(event: WebhookEvent) -> None:
        delivered.append((event, await own_env.get_current_time()))

    task_queue = f"webhooks-{uuid.uuid4()}"
    async with Worker(
        own_env.client,
        task_queue=task_queue,
        workflows=[CertificateWorkflow, WebhookDeliveryWorkflow],
        activities=[*fakes.activities(), deliver_webhook],
    ):
        handle: WorkflowHandle[Any, CertificateState] = await own_env.client.start_workflow(
            CERTIFICATE_WORKFLOW,
            CertificateInput(hostname=HOSTNAME, tenant_id="t-1"),
            id=f"certificate:{HOSTNAME}:{uuid.uuid4()}",
            task_queue=task_queue,
            result_type=CertificateState,
        )
        run = Run(own_env, fakes, handle)
        await run.until_active()
        await run.sleep_until(t0 + timedelta(days=3, hours=12))
        assert [e.event for e, _ in delivered] == []  # renewing, failing, not yet close

        await run.sleep_until(t0 + timedelta(days=4, hours=6))
        events = [e for e, _ in delivered]
        assert [e.event for e in events] == ["expiring_soon"]
        warned_at = delivered[0][1]
        threshold = t0 + lifetime - timedelta(days=2)
        assert threshold <= warned_at < threshold + timedelta(minutes=1)  # woken for it
        assert events[0].hostname == HOSTNAME and events[0].tenant_id == "t-1"
        assert events[0].expires_at == t0 + lifetime
        assert events[0].status.value == "RENEWING"

        await run.sleep_until(t0 + timedelta(days=5))
        assert [e.event for e, _ in delivered] == ["expiring_soon"]  # once, not per attempt

        await run.cancel()
        await run.until_calls("cancel_certificate", 1)
        # The canceled event is delivered by a WebhookDelivery child that runs on after
        # the parent's cancel: wait for that delivery itself (inside the worker's
        # lifetime), not for the parent's last step.
        await _deliveries(delivered, 2)

    names = [e.event for e, _ in delivered]
    assert names == ["expiring_soon", "canceled"]
    assert len({e.event_id for e, _ in delivered}) == 2


async def _deliveries(
    delivered: list[tuple[WebhookEvent, Any]], count: int, timeout: float = 30
) -> None:
    """Until ``count`` webhooks were delivered (wall-clock deadline; time skipping
    stays locked, so no durable timer fires meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(delivered) < count:
        if loop.time() >= deadline:
            pytest.fail(f"{count} deliveries expected, got {[e.event for e, _ in delivered]}")
        await asyncio.sleep(0.02)
