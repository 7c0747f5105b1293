"""What the product and operators see of a Certificate run: its search attributes
and current details in the Temporal UI (``show``), and its webhooks (``notify``:
a WebhookDelivery child each). Nothing secret."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from certflow import search
    from certflow.contract import WEBHOOK_DELIVERY_WORKFLOW, webhook_workflow_id
    from certflow.models import CertificateRecord, CertificateStatus
    from certflow.workflow_payloads import WebhookEvent
    from workflows.run_state import RunState


def show(state: RunState) -> None:
    """Show the state in the Temporal UI: search attributes (when the worker
    registered them) and the workflow's current details. Nothing secret.

    Called after every change of the record or the phase (``rows.set_record``,
    ``_enter``) and of the next wake-up. The attributes are upserted only when
    what they show changed; the first upsert of a run happens at its first
    change after the policy was read, and histories depend on that moment."""
    record = state.current
    if record is None:
        return
    if state.policy.search_attributes and not state.attributes_held:
        updates: list[SearchAttributeUpdate[Any]] = [
            search.STATUS.value_set(str(record.status)),
            search.ERROR_CODE.value_set(str(record.error_code))
            if record.error_code
            else search.ERROR_CODE.value_unset(),
            search.EXPIRES_AT.value_set(record.expires_at)
            if record.expires_at
            else search.EXPIRES_AT.value_unset(),
        ]
        if record.tenant_id:
            updates.append(search.TENANT.value_set(record.tenant_id))
        if state.policy.hostname_search_attribute:
            updates.insert(0, search.HOSTNAME.value_set(record.hostname))
        issuer = shown_issuer(record)
        if issuer is not None:  # never set by histories from before issuers
            updates.append(search.ISSUER.value_set(issuer))
        showing = shown(record)
        if showing != state.published:
            state.published = showing
            workflow.upsert_search_attributes(updates)
    details = [f"**{record.status}** — {state.phase}"]
    if state.next_attempt_at is not None:
        details.append(f"next: {state.next_attempt_at:%Y-%m-%d %H:%M:%S} UTC")
    if record.error_code:
        details.append(f"last error: {record.error_code}: {record.error_message or ''}")
    if record.expires_at is not None:
        details.append(f"expires: {record.expires_at:%Y-%m-%d %H:%M} UTC")
    workflow.set_current_details("\n\n".join(details))

def shown_at_start() -> tuple[object, ...] | None:
    """What the search attributes the run started with show (set by the
    client's start, or copied by continue-as-new), as ``shown`` says it; None
    when the start set no status."""
    attributes = workflow.info().typed_search_attributes
    status = attributes.get(search.STATUS)
    if status is None:
        return None
    # Strings: the row's enums compare equal to their values.
    shown: tuple[object, ...] = (
        status,
        attributes.get(search.ERROR_CODE),
        attributes.get(search.EXPIRES_AT),
        attributes.get(search.TENANT),
    )
    issuer = attributes.get(search.ISSUER)
    return shown if issuer is None else (*shown, issuer)

def shown_issuer(record: CertificateRecord) -> str | None:
    """The CA shown: the current certificate's once ACTIVE, else the attempt's."""
    if record.status is CertificateStatus.ACTIVE:
        return record.issuer
    return record.order_issuer or record.issuer

def shown(record: CertificateRecord) -> tuple[object, ...]:
    """What the search attributes show of a record."""
    shown: tuple[object, ...] = (
        record.status, record.error_code, record.expires_at, record.tenant_id
    )
    issuer = shown_issuer(record)
    return shown if issuer is None else (*shown, issuer)


async def notify(
    state: RunState, event: str, serial: str | None = None, about: CertificateRecord | None = None
) -> None:
    """Hand the event to a WebhookDelivery child that retries on its own and
    outlives this run (continue-as-new, cancel); ``about``: the record as this
    event describes it (the old tenant's view of a transfer), else the current."""
    record = about or state.record
    if not state.policy.webhooks or record is None:
        return
    event_id = str(workflow.uuid4())
    await workflow.start_child_workflow(
        WEBHOOK_DELIVERY_WORKFLOW,
        WebhookEvent(
            event_id=event_id,
            event=event,
            hostname=record.hostname,
            tenant_id=record.tenant_id,
            status=record.status,
            error_code=record.error_code,
            error_message=record.error_message,
            serial=serial,
            expires_at=record.expires_at,
            occurred_at=workflow.now(),
            issuer=state.issuer or record.issuer,
            issuer_reason=state.issuer_reason,
        ),
        id=webhook_workflow_id(record.hostname, event_id),
        parent_close_policy=ParentClosePolicy.ABANDON,
    )
