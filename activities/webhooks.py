"""Signed webhooks to the product: one POST per certificate event.

The body is JSON; ``Certflow-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of
"<t>.<body>" with CERTFLOW_WEBHOOK_SECRET>`` lets the receiver check origin and
freshness. Retries are the workflow's (durable); a 410 Gone stops them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable

import requests
from temporalio import activity
from temporalio.exceptions import ApplicationError

from certflow.errors import FailureType
from certflow.models import MethodReadiness
from certflow.workflow_payloads import WebhookEvent

Readiness = Callable[[str], Awaitable[list[MethodReadiness]]]
"""Each validation method's readiness for a hostname (DnsChecker.readiness)."""

SIGNATURE_HEADER = "Certflow-Signature"


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The signature header value for body sent at timestamp."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: bytes, header: str, body: bytes, tolerance_seconds: float = 300) -> bool:
    """What a receiver does: the signature matches and is recent."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs(time.time() - timestamp) > tolerance_seconds:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), header)


class WebhookActivities:
    """Delivers events to the configured URL; a ``not_ready`` event gets what the
    customer adds for each method, read when it is sent."""

    def __init__(
        self,
        url: str,
        secret: bytes,
        verify_tls: str | bool = True,
        readiness: Readiness | None = None,
    ) -> None:
        self._url = url
        self._secret = secret
        self._verify_tls = verify_tls
        self._readiness = readiness

    @activity.defn(name="deliver_webhook")
    async def deliver_webhook(self, event: WebhookEvent) -> None:
        """POST the event; any failure is retried by the caller's policy, 410 ends it."""
        if event.event == "not_ready" and self._readiness is not None:
            event = event.model_copy(update={"methods": await self._readiness(event.hostname)})
        body = json.dumps(event.model_dump(mode="json"), sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "certflow",
            SIGNATURE_HEADER: sign(self._secret, int(time.time()), body),
            "Certflow-Event-Id": event.event_id,
        }

        def post() -> requests.Response:
            return requests.post(
                self._url, data=body, headers=headers, timeout=10, verify=self._verify_tls
            )

        response = await asyncio.to_thread(post)
        if response.status_code == 410:
            raise ApplicationError(
                "the webhook receiver answered 410 Gone",
                type=FailureType.WEBHOOK_GONE,
                non_retryable=True,
            )
        if not response.ok:
            raise ApplicationError(
                f"the webhook receiver answered {response.status_code}",
                type=FailureType.WEBHOOK_FAILED,
            )
