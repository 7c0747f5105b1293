"""What ``migrate-runs`` does to every running Certificate workflow of the task
queue (docs/changing-the-workflow.md, "Retiring an old design"): signal
``migrate`` (a run of an older design continues as new in the current one at
once; nothing for the others), or, with ``--check``, ask each for its status and
count the runs by the design it names."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from temporalio.client import WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError

from certflow.contract import CERTIFICATE_DESIGN, CERTIFICATE_WORKFLOW
from certflow.product.client import CertflowClient
from certflow.workflow_payloads import CertificateState

IN_FLIGHT = 20
"""Signals or queries in flight at once (a signal is one billable action and one
history event; a query records nothing)."""


async def _each_run(
    client: CertflowClient, act: Callable[[WorkflowHandle[object, object]], Awaitable[None]]
) -> tuple[int, int]:
    """``act`` on every running Certificate workflow of the client's task queue, 20 at
    a time; how many were listed, and how many had ended by the time they were reached."""
    query = (
        f'WorkflowType="{CERTIFICATE_WORKFLOW}" AND ExecutionStatus="Running"'
        f' AND TaskQueue="{client.task_queue}"'
    )
    ids = [execution.id async for execution in client.temporal.list_workflows(query)]
    slots = asyncio.Semaphore(IN_FLIGHT)
    ended = 0

    async def one(workflow_id: str) -> None:
        nonlocal ended
        async with slots:
            try:
                await act(client.temporal.get_workflow_handle(workflow_id))
            except RPCError:
                ended += 1  # closed since it was listed

    await asyncio.gather(*(one(i) for i in ids))
    return len(ids), ended


async def signal_migrate(client: CertflowClient) -> int:
    """Signal ``migrate`` to every run."""

    async def migrate(handle: WorkflowHandle[object, object]) -> None:
        await handle.signal("migrate")

    listed, ended = await _each_run(client, migrate)
    print(f"migrate-runs: {listed - ended} runs signaled ({ended} ended meanwhile)")
    return 0


async def check_designs(client: CertflowClient) -> int:
    """Count the runs by the design their status names; 1 while any is older than
    the design this release starts and migrates to (CERTIFICATE_DESIGN), or could
    not say."""
    designs: Counter[int | None] = Counter()

    async def ask(handle: WorkflowHandle[object, object]) -> None:
        try:
            state = await handle.query("status", result_type=CertificateState)
        except WorkflowQueryFailedError:
            designs[None] += 1  # its worker cannot run it (a retired design)
            return
        designs[state.design] += 1

    _, ended = await _each_run(client, ask)
    older = sum(n for design, n in designs.items() if design is not None and design < CERTIFICATE_DESIGN)
    counts = [f"design {d}: {n}" for d, n in sorted((d, n) for d, n in designs.items() if d is not None)]
    if designs[None]:  # a worker of a release before the status named it, or none could answer
        counts.append(f"design unknown: {designs[None]}")
    print(
        f"migrate-runs --check: {', '.join(counts) or 'no runs'} ({ended} ended meanwhile);"
        f" {older} older than the current design {CERTIFICATE_DESIGN}"
    )
    return 1 if older or designs[None] else 0
