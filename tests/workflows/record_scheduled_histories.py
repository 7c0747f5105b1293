"""Record the histories of the scheduled passes that test_replay_scheduled.py replays.

    .venv/bin/python -m tests.workflows.record_scheduled_histories LABEL

Runs one Reconcile pass outside the prune hour, one inside it (the first hour of
the UTC day, workflows/reconcile.py) and one RenewalInfoSweep pass on the
time-skipping test server with the fakes (tests/workflows/scheduled_fakes.py),
and writes each history to
tests/workflows/histories/scheduled/<scenario>-LABEL-<n>.json. Never overwrite:
record once on the code before a change to these workflows (``every-pass``: the
code that pruned after every pass, behind the event-retention patch) and once
after it (``daily-prune``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from certflow.contract import RECONCILE_WORKFLOW, RENEWAL_INFO_SWEEP_WORKFLOW
from tests.workflows.conftest import find_test_server
from tests.workflows.scheduled_fakes import ScheduledFakes, skip_to, worker
from workflows.reconcile import ReconcileWorkflow
from workflows.renewal_info_sweep import RenewalInfoSweepWorkflow

HISTORIES = Path(__file__).parent / "histories" / "scheduled"


def _write(name: str, history: WorkflowHistory) -> None:
    HISTORIES.mkdir(parents=True, exist_ok=True)
    path = HISTORIES / f"{name}.json"
    if path.exists():
        raise FileExistsError(f"{path} is checked in: record under a new label")
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    print(f"wrote {path.relative_to(HISTORIES.parent.parent)} ({len(history.events)} events)")


async def _one(env: WorkflowEnvironment, workflow_type: str, name: str) -> None:
    fakes = ScheduledFakes()
    async with worker(env, fakes, [ReconcileWorkflow, RenewalInfoSweepWorkflow]) as queue:
        handle = await env.client.start_workflow(
            workflow_type, id=f"{name}-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        await handle.result()
        _write(name, await handle.fetch_history())


async def _main(label: str) -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_test_server(), data_converter=pydantic_data_converter
    )
    try:
        await skip_to(env, 12.0)
        await _one(env, RECONCILE_WORKFLOW, f"reconcile-{label}-1")
        await _one(env, RENEWAL_INFO_SWEEP_WORKFLOW, f"renewal-info-sweep-{label}-1")
        await skip_to(env, 0.5)
        await _one(env, RECONCILE_WORKFLOW, f"reconcile-{label}-2")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    asyncio.run(_main(sys.argv[1]))
