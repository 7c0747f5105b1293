"""Every checked-in history of a supported design replays on today's code, and a
history of a retired one stops with the reason.

The histories (tests/workflows/histories) are of the designs this code supports
(workflows/patches.py, OLDEST_SUPPORTED_DESIGN to CURRENT_DESIGN): the scenarios
recorded on real servers by record_histories.py (the labels ``one-step`` and
``kept-run``), and the paths no real server produces on demand, recorded with
the fakes by record_patch_histories.py, on each side of the patches newer than
the oldest supported design. A change to the workflow that would make one of
them take another path fails here: guard it with ``workflow.patched()`` so
running certificates keep their course.

``histories/retired`` holds those of the retired designs (1 and 2): each must
stop at its first workflow task with RetiredDesign's message, not with a
nondeterminism error deep in the run (docs/changing-the-workflow.md, "Retiring
an old design").
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.certificate import CertificateWorkflow
from workflows.patches import CURRENT_DESIGN, OLDEST_SUPPORTED_DESIGN, UNNAMED_START_PATCH

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json"))
RETIRED = sorted((HERE / "retired").glob("*.json"))


def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(f"certificate:{path.stem}", path.read_text())


def test_the_scenarios_are_all_there() -> None:
    names = {path.stem.rsplit("-", 1)[0] for path in HISTORIES}
    scenarios = {"happy-path", "dns-wait", "renewal", "edge-unreachable", "rate-limited", "ari-renewal"}
    with_the_fakes = {
        # finalize_and_store stored the certificate but its answer was lost.
        "row-moved-on",
        # Two issuers: a long cooldown at the first, issued by the second, renewed there.
        "issuer-fallback",
        # A transfer and a renew signal reaching the run that hands over after an
        # issuance; two failed attempts then one whose worker was lost. Each also
        # without its patch's marker (RENEW_NEXT_RUN_PATCH, LOST_WORKER_PATCH).
        "handing-over-renew-next-run",
        "budget-lost-worker",
        # A run that continued as new while waiting for DNS; FAILED, then retried.
        "long-dns-wait",
        "failed-then-retried",
        # A run of the oldest supported design continuing as new in the current one.
        "migrate-at-wait",
    }
    assert names == (
        {f"{s}-one-step" for s in scenarios}
        | {f"{s}-kept-run" for s in scenarios | with_the_fakes}
        | {"handing-over-renew-next-run-kept-run-unpatched", "budget-lost-worker-kept-run-unpatched"}
        | {"start-in-design"}
    )


def _design(path: Path) -> int | None:
    """The design a history's start names (None: taken by a patch marker)."""
    started = json.loads(path.read_text())["events"][0]["workflowExecutionStartedEventAttributes"]
    design: int | None = json.loads(base64.b64decode(started["input"]["payloads"][0]["data"])).get("design")
    return design


def test_the_histories_are_sorted_by_design() -> None:
    """A history of a retired design belongs in histories/retired; a start that
    names none is of a supported design only with UNNAMED_START_PATCH's marker.
    Red with a retired history moved back beside the others."""
    for path in HISTORIES:
        design = _design(path)
        if design is None:
            assert UNNAMED_START_PATCH in _patch_markers(path), path.name
        else:
            assert OLDEST_SUPPORTED_DESIGN <= design <= CURRENT_DESIGN, path.name
    for path in RETIRED:
        design = _design(path)
        assert design is None or design < OLDEST_SUPPORTED_DESIGN, path.name


def _patch_markers(path: Path) -> list[str]:
    """The patches whose markers the history holds."""
    patches = []
    for event in json.loads(path.read_text())["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker["markerName"] == "core_patch":
            data = marker["details"]["patch-data"]["payloads"][0]["data"]
            patches.append(json.loads(base64.b64decode(data))["id"])
    return patches


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path) -> None:
    history = _history(path)
    replayer = Replayer(workflows=[CertificateWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
    assert len(history.events) > 10


@pytest.mark.parametrize("path", RETIRED, ids=[p.stem for p in RETIRED])
async def test_a_retired_design_stops_with_the_reason(path: Path) -> None:
    """Red when ``design_of`` lets a retired design run: the history then fails on
    a nondeterminism error somewhere in its run, or replays on paths that are gone."""
    replayer = Replayer(workflows=[CertificateWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    failure = str(result.replay_failure)
    assert 'type: "RetiredDesign"' in failure and "which this worker no longer replays" in failure, failure
