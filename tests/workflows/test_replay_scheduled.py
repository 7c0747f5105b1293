"""Every checked-in history of the scheduled passes (the Reconcile and
RenewalInfoSweep workflows, tests/workflows/histories/scheduled, recorded by
record_scheduled_histories.py) replays on today's code.

A pass lasts seconds (a cold reconcile hours), so what these guard is the pass in
flight when its worker is replaced: the ``every-pass`` label is the code that
pruned after every pass behind the event-retention patch marker, ``daily-prune``
the code that prunes in the first hour of the UTC day and records no marker, with
the sweep's longer timeouts (timeouts are not compared on replay). Checked red:
with ``ReconcileWorkflow._prunes`` deciding by the hour alone, both ``every-pass``
reconcile histories fail ("patch marker encountered for change event-retention,
but there is no corresponding change command"), the one recorded in the first
hour too; a pass that asks for the marker while it runs still replays these and
is caught by test_scheduled_workflows.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.reconcile import ReconcileWorkflow
from workflows.renewal_info_sweep import RenewalInfoSweepWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories" / "scheduled").glob("*.json"))


def test_the_scenarios_are_all_there() -> None:
    assert {path.stem for path in HISTORIES} == {
        # Pruned after every pass (EVENT_RETENTION_PATCH marker): at noon, in the first hour.
        "reconcile-every-pass-1",
        "reconcile-every-pass-2",
        "renewal-info-sweep-every-pass-1",
        # No marker; pruned only in the first UTC hour: at noon (one activity), then in it.
        "reconcile-daily-prune-1",
        "reconcile-daily-prune-2",
        "renewal-info-sweep-daily-prune-1",
    }


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[ReconcileWorkflow, RenewalInfoSweepWorkflow], data_converter=pydantic_data_converter
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
