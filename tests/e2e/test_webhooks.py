"""Signed webhooks for the product: issued, renewed, canceled, retried durably."""

from __future__ import annotations

import asyncio
import time

import pytest

from activities.webhooks import SIGNATURE_HEADER, verify
from certflow.client import CertflowClient
from tests.e2e.conftest import WEBHOOK_SECRET, Deployment, WebhookReceiver

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
        assert b"PRIVATE KEY" not in body


async def test_a_refused_delivery_is_retried(
    deployment: Deployment, client: CertflowClient, webhooks: WebhookReceiver
) -> None:
    hostname = deployment.hostname("hooks-retry")
    webhooks.refuse_first.add(hostname)
    await client.request([hostname])
    started = time.monotonic()
    assert await _events(webhooks, hostname, 1, timeout=90) == ["issued"]
    # The first POST got a 500; the WebhookDelivery workflow retried after its backoff.
    assert time.monotonic() - started >= 4
