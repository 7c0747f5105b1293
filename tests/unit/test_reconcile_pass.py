"""What a reconcile pass reports and how it shows it is alive, at cold-start size."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.reconcile import _Pass
from certflow.workflow_payloads import ReconcileResult


def test_a_cold_pass_heartbeats_per_start_and_lists_a_bounded_sample() -> None:
    """20,000 rows started in one pass: the result stays one small payload (the
    first 100 names and the counts) and the activity heartbeats once per start.

    Fails with the lists uncapped (20,000 names: ~600 KB in one history event, over
    Temporal's 2 MB payload limit at 100,000) or with the heartbeat back at one per
    500-row page (a page took ~38 s at 13 starts/s against a 30 s heartbeat timeout:
    the pass was cancelled and retried from scratch).
    """
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    def cold_pass() -> ReconcileResult:
        result = _Pass()
        for i in range(20_000):
            result.add_started(f"h{i}.example.com")
        for i in range(3):
            result.add_refused(f"bad {i}")
        result.checked = 20_003
        return result.result()

    result = env.run(cold_pass)
    assert len(result.started) == ReconcileResult.LISTED
    assert result.total_started == 20_000
    assert result.total_refused == 3 and result.refused == ["bad 0", "bad 1", "bad 2"]
    assert len(beats) == 20_000
    assert len(result.model_dump_json()) < 10_000


def test_a_result_recorded_before_the_cap_reads_its_counts_from_the_lists() -> None:
    """Reconcile results in old histories have no counts: the totals are the lists'
    lengths (fails if ``total_started`` read a missing count as 0)."""
    old = ReconcileResult.model_validate_json('{"checked": 2, "started": ["a.example.com"]}')
    assert old.total_started == 1 and old.total_refused == 0
