"""Webhook events from the Certificate workflow: expiring_soon during a failing
renewal, not_ready while the customer's DNS is not ready, and canceled, each handed to a WebhookDelivery child (issued and
renewed are covered end to end in tests/e2e/test_webhooks.py).

Each test gets a time-skipping server of its own: a WebhookDelivery child is
abandoned by design (it outlives its parent), and on the shared server its
timers would keep later tests' time skipping busy."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from certflow.contract import CERTIFICATE_DESIGN, CERTIFICATE_WORKFLOW
from certflow.workflow_payloads import CertificateInput, CertificateState, WebhookEvent
from certflow.errors import ErrorCode
from tests.workflows.fakes import (
    DEFAULT,
    FAST_POLICY,
    HOSTNAME,
    Fakes,
    Run,
    acme_temporary_error,
    active_row,
    app_error,
    dns_cname_error,
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


@asynccontextmanager
async def _certificate(
    env: WorkflowEnvironment,
    fakes: Fakes,
    delivered: list[tuple[WebhookEvent, Any]],
    tenant_id: str | None = None,
) -> AsyncIterator[Run]:
    """A Certificate workflow on a worker whose deliver_webhook appends each event
    (with the test server's time) to ``delivered``."""

    @activity.defn(name="deliver_webhook")
    async def deliver_webhook(event: WebhookEvent) -> None:
        delivered.append((event, await env.get_current_time()))

    task_queue = f"webhooks-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[CertificateWorkflow, WebhookDeliveryWorkflow],
        activities=[*fakes.activities(), deliver_webhook],
    ):
        handle: WorkflowHandle[Any, CertificateState] = await env.client.start_workflow(
            CERTIFICATE_WORKFLOW,
            CertificateInput(hostname=HOSTNAME, tenant_id=tenant_id, design=CERTIFICATE_DESIGN),
            id=f"certificate:{HOSTNAME}:{uuid.uuid4()}",
            task_queue=task_queue,
            result_type=CertificateState,
        )
        yield Run(env, fakes, handle)


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
    async with _certificate(own_env, fakes, delivered, tenant_id="t-1") as run:
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


async def test_not_ready_is_sent_once_per_reason_while_waiting_for_the_customer(
    own_env: WorkflowEnvironment,
) -> None:
    """A hostname whose CNAME is missing for three checks, then whose ownership is
    unproven for two, then ready: one ``not_ready`` per reason (DNS_CNAME, then
    OWNERSHIP_UNVERIFIED), each PENDING with its code, then ``issued``.

    Shown red: with the ``outcome.error_code is not record.error_code`` guard
    removed from workflows/failures.py, every re-check sent one."""
    policy = FAST_POLICY.model_copy(update={"webhooks": True})

    async def check_dns(index: int, _: Any) -> Any:
        if index < 3:
            raise dns_cname_error()
        if index < 5:
            raise app_error(ErrorCode.OWNERSHIP_UNVERIFIED, f"no proof at _certflow.{HOSTNAME}")
        return DEFAULT  # the fake's own verdict

    fakes = Fakes(own_env, policy=policy, behaviours={"check_dns": check_dns})
    delivered: list[tuple[WebhookEvent, Any]] = []
    async with _certificate(own_env, fakes, delivered) as run:
        while len(fakes.of("check_dns")) < 5:  # the re-checks, 1, 2, 4 and 8 minutes apart
            await own_env.sleep(timedelta(minutes=10))
        await run.signal("retry")  # the customer fixed it and pressed "verify"
        await run.until_active()
        await _deliveries(delivered, 3)
    events = [e for e, _ in delivered]
    assert [e.event for e in events] == ["not_ready", "not_ready", "issued"], events
    assert [str(e.error_code) for e in events[:2]] == ["DNS_CNAME", "OWNERSHIP_UNVERIFIED"]
    assert all(e.status.value == "PENDING" for e in events[:2])
    assert len(fakes.of("check_dns")) == 6
