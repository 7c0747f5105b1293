"""The WebhookDelivery workflow: delivers one certificate event, retrying durably.

A child of the Certificate workflow that outlives it (parent-close ABANDON), so
a continue-as-new or a cancel never loses a delivery; its id makes each event
delivered once.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.webhooks import WebhookActivities
    from certflow.contract import WEBHOOK_DELIVERY_WORKFLOW
    from certflow.errors import FailureType
    from certflow.workflow_payloads import WebhookEvent

DELIVERY_DEADLINE = timedelta(days=3)


@workflow.defn(name=WEBHOOK_DELIVERY_WORKFLOW)
class WebhookDeliveryWorkflow:
    """Retries the POST with backoff up to an hour apart, for up to three days."""

    @workflow.run
    async def run(self, event: WebhookEvent) -> None:
        await workflow.execute_activity_method(
            WebhookActivities.deliver_webhook,
            event,
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=DELIVERY_DEADLINE,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=5),
                maximum_interval=timedelta(hours=1),
                non_retryable_error_types=[FailureType.WEBHOOK_GONE],
            ),
        )
