"""The certificate row as a Certificate run knows it, and its writes: each guarded
transition returns the row it left (``RETURNING``, certflow/store), which becomes
the run's record and is shown (``publish.show``); a step that only touches
Postgres runs as a local activity."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.records import RecordActivities
    from certflow.activity_payloads import EnsureCertificateInput
    from certflow.models import CertificateRecord, RequestedMethod
    from workflows.run_state import RunState
    from workflows.steps import POSTGRES, POSTGRES_LOCAL, run, run_local

from workflows import publish

S = TypeVar("S")
A = TypeVar("A")
R = TypeVar("R")


def set_record(state: RunState, record: CertificateRecord) -> None:
    """The run's record is now ``record``, shown."""
    state.current = record
    publish.show(state)


def set_written(
    state: RunState, row: CertificateRecord | None, before: CertificateRecord, **wrote: Any
) -> CertificateRecord:
    """The record after a guarded transition: the row it returned; without one
    (histories from before transitions returned their row, or a transition that
    found no row to write), ``before`` with what the transition wrote, as those
    runs went on."""
    record = row if row is not None else before.model_copy(update=wrote)
    set_record(state, record)
    return record


def just_read(state: RunState) -> bool:
    """The row was read in this workflow task: nothing waited since (any wait ends
    the task, and the next one starts later)."""
    return state.row_read_at == workflow.now()


async def postgres(activity: Callable[[S, A], Awaitable[R]], arg: A) -> R:
    """A step that only touches Postgres: local (a marker, no task of its own), a
    regular activity when Postgres has not answered it within a minute."""
    try:
        return await run_local(POSTGRES_LOCAL, activity, arg)
    except ActivityError:
        workflow.logger.warning("Postgres did not answer a local step: retrying it as an activity")
    return await run(POSTGRES, activity, arg)


async def read(
    state: RunState,
    tenant_id: str | None,
    method: RequestedMethod | None = None,
    requested: CertificateRecord | None = None,
) -> None:
    """The row and the worker's policy, read (the row made if missing; a method the
    workflow's input asked for becomes the row's); ``requested``, the row a
    request has just written, is taken as read."""
    ensured = await postgres(
        RecordActivities.ensure_certificate,
        EnsureCertificateInput(
            hostname=state.hostname, tenant_id=tenant_id, method=method, requested=requested
        ),
    )
    set_record(state, ensured.record)
    state.policy = ensured.policy
    state.row_read_at = workflow.now()
