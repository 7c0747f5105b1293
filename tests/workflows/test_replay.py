"""Every checked-in history of the Certificate workflow replays on today's code.

The histories (tests/workflows/histories, recorded by record_histories.py on
real servers) cover the happy path, a DNS wait, failures then FAILED then
retry, and a renewal, each run of each; later labels add an unreachable edge,
a rate limit and an ARI renewal. Those of record_patch_histories.py
show each patched path before and after its patch. A change to the workflow that would
make an old history take another path fails here: guard it with
``workflow.patched()`` so running certificates keep their course.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.certificate import CertificateWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_the_scenarios_are_all_there() -> None:
    names = {path.stem.rsplit("-", 1)[0] for path in HISTORIES}
    assert names == {
        "happy-path",
        "dns-wait",
        "failure-and-retry",
        "renewal",
        # FOLLOW_MOVED_ROW_PATCH: recorded before it (the run ended) and after it.
        "row-moved-on-unpatched",
        "row-moved-on",
        # PLACE_ORDER_PATCH: the four scenarios again, after it (the ones above are before).
        "happy-path-place-order",
        "dns-wait-place-order",
        "failure-and-retry-place-order",
        "renewal-place-order",
        # HTTP01_SELF_CHECK_PATCH, COOLDOWN_SPREAD_PATCH, RENEWAL_INFO_SWEEP_PATCH and
        # BOUNDED_HISTORY_PATCH: the scenarios after them, on real servers…
        "happy-path-sweep",
        "dns-wait-sweep",
        "renewal-sweep",
        "edge-unreachable-sweep",
        "rate-limited-sweep",
        "ari-renewal-sweep",
        # …and with the fakes: a run that continued as new while waiting; FAILED.
        "long-dns-wait-sweep",
        "failed-then-retried-sweep",
        # The run after an issuance starts from the carried row (no read) and sleeps
        # to the ARI window finalize_and_store asked for.
        "happy-path-carried",
        "dns-wait-carried",
        "renewal-carried",
        "edge-unreachable-carried",
        "rate-limited-carried",
        "ari-renewal-carried",
        # Two issuers (with the fakes): a long cooldown at the first, issued by the
        # second, renewed there.
        "issuer-fallback",
        # FEWER_ROUND_TRIPS_PATCH: the row read and the DNS check local, the
        # self-check inside validate_order, no marker for the patches before it.
        "happy-path-fewer",
        "dns-wait-fewer",
        "renewal-fewer",
        "edge-unreachable-fewer",
        "rate-limited-fewer",
        "ari-renewal-fewer",
        # RENEW_NEXT_RUN_PATCH (with the fakes): a transfer and a renew signal that
        # reach the run handing over after an issuance, before the patch (renewed at
        # the renewal time) and after it (renewed by the next run at once).
        "handing-over-renew-next-run-unpatched",
        "handing-over-renew-next-run",
        # LOST_WORKER_PATCH (with the fakes): two failed attempts, then one whose
        # worker was lost: before the patch FAILED (and retried), after it issued.
        "budget-lost-worker-unpatched",
        "budget-lost-worker",
        # The transitions return their row (no patch: their results carry it, and
        # those recorded before decode without it): the scenarios on real servers.
        "happy-path-rows",
        "dns-wait-rows",
        "renewal-rows",
        "edge-unreachable-rows",
        "rate-limited-rows",
        "ari-renewal-rows",
        # ORDER_IN_ONE_STEP_DESIGN (asked for by the start, no marker): the order
        # placed and validated in one activity, the row read again when it fails;
        # the start's search attributes taken as shown.
        "happy-path-one-step",
        "dns-wait-one-step",
        "renewal-one-step",
        "edge-unreachable-one-step",
        "rate-limited-one-step",
        "ari-renewal-one-step",
        # RUN_KEPT_AFTER_ISSUANCE_DESIGN (asked for by the start): the run that
        # issued goes on to wait for the renewal, and renews, itself; the request's
        # row taken as read by the first step.
        "happy-path-kept-run",
        "dns-wait-kept-run",
        "renewal-kept-run",
        "edge-unreachable-kept-run",
        "rate-limited-kept-run",
        "ari-renewal-kept-run",
    }


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(f"certificate:{path.stem}", path.read_text())
    replayer = Replayer(workflows=[CertificateWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
    assert len(history.events) > 10
