"""Signed webhooks for the product: issued, renewed, canceled, not_ready with the
records to add, retried durably, stopped by 410."""

from __future__ import annotations

import asyncio
import time

import pytest

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from activities.webhooks import SIGNATURE_HEADER, verify
from certflow.product.client import CertflowClient
from certflow.contract import webhook_workflow_id
from devstack import servers
from tests.e2e.conftest import CNAME_TARGET, WEBHOOK_SECRET, Deployment, WebhookAttempt, WebhookReceiver
from tests.leaks import key_needles, scan_bytes

pytestmark = pytest.mark.e2e


async def _events(webhooks: WebhookReceiver, hostname: str, count: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(webhooks.events_for(hostname)) < count:
        assert time.monotonic() < deadline, f"got {webhooks.events_for(hostname)}"
        await asyncio.sleep(0.1)
    return [str(e["event"]) for _, e in webhooks.events_for(hostname)]


async def _settled_active(client: CertflowClient, hostname: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        report = await client.status(hostname)
        if report and report.status == "ACTIVE" and "renewal time" in (report.phase or ""):
            return
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def test_issued_renewed_and_canceled_are_delivered_signed(
    deployment: Deployment, client: CertflowClient, webhooks: WebhookReceiver
) -> None:
    hostname = deployment.hostname("hooks")
    await client.request([hostname], tenant_id="tenant-hooks")
    assert await _events(webhooks, hostname, 1) == ["issued"]
    await _settled_active(client, hostname)
    await client.renew(hostname)
    assert await _events(webhooks, hostname, 2) == ["issued", "renewed"]
    await _settled_active(client, hostname)
    await client.cancel(hostname)
    assert await _events(webhooks, hostname, 3) == ["issued", "renewed", "canceled"]

    events = [e for _, e in webhooks.events_for(hostname)]
    assert events[0]["tenant_id"] == "tenant-hooks" and events[0]["status"] == "ACTIVE"
    assert events[0]["serial"] != events[1]["serial"]
    assert events[2]["status"] == "CANCELED"
    assert len({e["event_id"] for e in events}) == 3
    for headers, body in webhooks.raw_for(hostname):
        assert verify(WEBHOOK_SECRET.encode(), headers[SIGNATURE_HEADER], body)
        assert not verify(b"another secret", headers[SIGNATURE_HEADER], body)
        assert not scan_bytes(body, key_needles(*servers.captured_keys(deployment.key_capture)))


async def test_not_ready_tells_the_customer_what_to_add(
    deployment: Deployment, client: CertflowClient, webhooks: WebhookReceiver
) -> None:
    """A hostname requested before its CNAME exists: one ``not_ready`` (PENDING,
    DNS_CNAME) whose ``methods`` name the record to add, read by the worker when it
    was sent; the CNAME added and ``retry`` pressed, ``issued`` follows.

    Shown red: with the readiness not passed to WebhookActivities in worker.py,
    ``methods`` was null."""
    hostname = deployment.bare_hostname("hooks-late")
    await client.request([hostname], tenant_id="tenant-late")
    assert await _events(webhooks, hostname, 1) == ["not_ready"]
    [(_, event)] = webhooks.events_for(hostname)
    assert event["status"] == "PENDING" and event["error_code"] == "DNS_CNAME", event
    listed = event["methods"]
    assert isinstance(listed, list), event
    methods = {m["method"]: m for m in listed}
    assert methods["http-01"]["ready"] is False, event
    assert methods["http-01"]["record"] == {"name": hostname, "type": "CNAME", "value": CNAME_TARGET}
    deployment.pebble.set_cname(hostname, CNAME_TARGET)
    await client.retry(hostname)
    assert await _events(webhooks, hostname, 2) == ["not_ready", "issued"]
    await client.cancel(hostname)


# workflows/webhooks.py: RetryPolicy(initial_interval=timedelta(seconds=5), ...) of the
# deliver_webhook activity.
RETRY_INITIAL_INTERVAL_S = 5.0
# The receiver's clock and the Temporal server's timers are the same machine's; this
# only absorbs sub-second rounding, never a shorter backoff.
CLOCK_MARGIN_S = 0.25


async def _attempts(
    webhooks: WebhookReceiver, hostname: str, count: int, timeout: float = 90
) -> list[WebhookAttempt]:
    deadline = time.monotonic() + timeout
    while len(webhooks.attempts_for(hostname)) < count:
        assert time.monotonic() < deadline, f"got {webhooks.attempts_for(hostname)}"
        await asyncio.sleep(0.05)
    return webhooks.attempts_for(hostname)


async def test_a_refused_delivery_is_retried(
    deployment: Deployment, client: CertflowClient, webhooks: WebhookReceiver
) -> None:
    """The first POST gets a 500; the WebhookDelivery workflow retries the same event
    after its backoff. The gap is measured between the two POSTs as the receiver saw
    them (issuance time plays no part), against the retry policy's initial interval.

    Checked: with ``initial_interval`` set to 1 s in workflows/webhooks.py, the test
    failed (gap 1.02 s < 4.75 s); reverted."""
    hostname = deployment.hostname("hooks-retry")
    webhooks.refuse_first.add(hostname)
    await client.request([hostname])
    assert await _events(webhooks, hostname, 1, timeout=90) == ["issued"]
    refused, retried = (await _attempts(webhooks, hostname, 2))[:2]
    assert (refused.answered, retried.answered) == (500, 204), (refused, retried)
    assert refused.event == retried.event == "issued"
    assert refused.event_id == retried.event_id, "the retry must deliver the same event"
    gap = retried.at - refused.at
    print(f"\nrefused delivery retried after {gap:.2f} s (initial interval {RETRY_INITIAL_INTERVAL_S:g} s)")
    assert gap >= RETRY_INITIAL_INTERVAL_S - CLOCK_MARGIN_S, gap


async def test_a_410_gone_stops_the_delivery_at_once(
    deployment: Deployment, client: CertflowClient, webhooks: WebhookReceiver
) -> None:
    """A receiver answering 410 Gone gets exactly one POST: the activity's non-retryable
    WEBHOOK_GONE ends the WebhookDelivery workflow without a second attempt.

    Checked: with the 410 branch removed from activities/webhooks.py, a second POST
    of the same event came and the test failed (2 attempts, not 1); reverted."""
    hostname = deployment.hostname("hooks-gone")
    webhooks.gone.add(hostname)
    await client.request([hostname])
    [first] = (await _attempts(webhooks, hostname, 1))[:1]
    assert (first.event, first.answered) == ("issued", 410), first
    handle = client.temporal.get_workflow_handle(webhook_workflow_id(hostname, first.event_id))
    # Closed (a retry would keep it running: the policy retries for three days), or
    # a second POST arrives: whichever comes first decides.
    deadline = time.monotonic() + 60
    while True:
        description = await handle.describe()
        if description.status is not WorkflowExecutionStatus.RUNNING:
            break
        assert len(webhooks.attempts_for(hostname)) == 1, webhooks.attempts_for(hostname)
        assert time.monotonic() < deadline, "the WebhookDelivery workflow is still running"
        await asyncio.sleep(0.05)
    attempts = webhooks.attempts_for(hostname)
    assert len(attempts) == 1, attempts
    history = await handle.fetch_history()
    started = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert started == [1], started
    failures = [
        e.activity_task_failed_event_attributes.failure.application_failure_info
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    ]
    assert [(f.type, f.non_retryable) for f in failures] == [("WEBHOOK_GONE", True)], failures
    print(f"\n410 Gone: one POST; WebhookDelivery closed {description.status.name if description.status else None}")
