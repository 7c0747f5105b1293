"""Record the histories that prove a patch keeps old runs replaying.

    .venv/bin/python -m tests.workflows.record_patch_histories [SUFFIX]

Runs the scenarios a ``workflow.patched()`` guards on the time-skipping test
server with the fakes (no real server produces them on demand) and writes each
history to tests/workflows/histories/<scenario>[-SUFFIX]-<n>.json. Record once on
the code before the patch (with a suffix such as ``unpatched``) and once after:
test_replay.py replays both on today's code. No suffix or ``unpatched``: the
follow-moved-row scenario; ``sweep``: a DNS wait long enough to continue as new
(bounded-history) and the FAILED path after the self-check patch; ``issuers``: a
fallback between two issuers and a renewal that stays with the second;
``renew-next-run`` (and ``renew-next-run-unpatched``, on the code before it): a
transfer and a ``renew`` signal that reach the run handing over after an issuance;
``lost-worker`` (and ``lost-worker-unpatched``): two failed attempts, then one whose
worker was lost (FAILED before the patch, then retried; issued after it).
"""

from __future__ import annotations

import asyncio
import json
import sys

from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from datetime import timedelta

from tests.workflows.conftest import find_test_server
from tests.workflows.fakes import (
    FAST_POLICY,
    Fakes,
    acme_temporary_error,
    dns_cname_error,
    Run,
    fail_first,
    started,
)
from tests.workflows.record_histories import HISTORIES
from tests.workflows.test_certificate_ownership import handing_over_after_issuance
from tests.workflows.test_certificate_workflow import answered_twice_then_lost, stored_but_result_lost


async def _row_moved_on(env: WorkflowEnvironment, name: str) -> None:
    """finalize_and_store stored the certificate but its result was lost."""
    fakes = Fakes(env)
    fakes.behaviours["finalize_and_store"] = stored_but_result_lost(fakes)
    async with started(env, fakes) as run:
        await asyncio.sleep(3)  # the old code ends by then; the patched one waits to renew
        if (await run.handle.describe()).status is WorkflowExecutionStatus.RUNNING:
            await run.cancel()
        else:
            await run.result()
        history = await run.handle.fetch_history()
    path = HISTORIES / f"{name}-1.json"
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    print(f"wrote {path.name} ({len(history.events)} events)")


def _write(name: str, history: object, events: int) -> None:
    path = HISTORIES / f"{name}.json"
    if path.exists():
        raise FileExistsError(f"{path} is checked in: record under a new suffix")
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")  # type: ignore[attr-defined]
    print(f"wrote {path.name} ({events} events)")


async def _long_dns_wait(env: WorkflowEnvironment, name: str) -> None:
    """Wrong DNS long enough for a run to pass the bound and continue as new
    (BOUNDED_HISTORY_PATCH): both runs, the first ending in continue-as-new."""
    policy = FAST_POLICY.model_copy(
        update={"dns_recheck_initial_seconds": 3600, "dns_recheck_max_seconds": 3600}
    )
    fakes = Fakes(env, policy=policy, behaviours={"check_dns": fail_first(60, dns_cname_error)})
    async with started(env, fakes) as run:
        await run.until_active(advance=timedelta(hours=6), timeout=180)
        await run.cancel()
        first = env.client.get_workflow_handle(run.handle.id, run_id=run.handle.first_execution_run_id)
        for n, handle in enumerate((first, run.handle), 1):
            history = await handle.fetch_history()
            _write(f"{name}-{n}", history, len(history.events))


async def _failed_then_retried(env: WorkflowEnvironment, name: str) -> None:
    """Three failed attempts, FAILED, retry, ACTIVE (the FAILED path after the
    self-check patch: no one DNS lets a real CA fail what the self-check passes)."""
    fakes = Fakes(env, behaviours={"finalize_and_store": fail_first(3, acme_temporary_error)})
    async with started(env, fakes) as run:
        await run.until(lambda s: s.status.value == "FAILED", "FAILED", advance=10)
        await run.handle.signal("retry")
        await run.until_active()
        await run.cancel()
        first = env.client.get_workflow_handle(run.handle.id, run_id=run.handle.first_execution_run_id)
        for n, handle in enumerate((first, run.handle), 1):
            history = await handle.fetch_history()
            _write(f"{name}-{n}", history, len(history.events))


async def _issuer_fallback(env: WorkflowEnvironment, name: str) -> None:
    """Two issuers: a cooldown at the first longer than the fallback setting, the
    certificate issued by the second, renewed there; the runs of both issuances."""
    policy = FAST_POLICY.model_copy(
        update={"issuers": ["a", "b"], "issuer_fallback_cooldown_seconds": 3600}
    )
    fakes = Fakes(env, policy=policy)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 7200)
    async with started(env, fakes) as run:
        await run.until_active()
        await run.handle.signal("renew")
        await run.until_active(serial_count=2)
        await run.cancel()
        await _write_runs(env, run, name)


async def _write_runs(env: WorkflowEnvironment, run: Run, name: str, runs: int | None = None) -> None:
    """Every run of the workflow (the first ``runs``), each continued as new into the next."""
    run_id: str | None = run.handle.first_execution_run_id
    n = 0
    while run_id and (runs is None or n < runs):
        n += 1
        history = await env.client.get_workflow_handle(run.handle.id, run_id=run_id).fetch_history()
        _write(f"{name}-{n}", history, len(history.events))
        last = history.events[-1]
        continued = last.workflow_execution_continued_as_new_event_attributes
        run_id = continued.new_execution_run_id if last.HasField(
            "workflow_execution_continued_as_new_event_attributes"
        ) else None


async def _renew_while_handing_over(env: WorkflowEnvironment, name: str) -> None:
    """A transfer that ends, and a ``renew`` signal that comes, while the run that
    issued hands over (RENEW_NEXT_RUN_PATCH): the runs up to the renewal's."""

    async def keep(run: Run) -> None:
        await _write_runs(env, run, name, runs=2)  # the third has only begun its wait

    await handing_over_after_issuance(env, transfer_refused=False, renew_signal=True, keep=keep)


async def _lost_worker(env: WorkflowEnvironment, name: str) -> None:
    """Two failed attempts, then one whose worker was lost (LOST_WORKER_PATCH): before
    the patch FAILED and retried, after it issued; every run up to the renewal wait."""
    fakes = Fakes(env, behaviours={"finalize_and_store": answered_twice_then_lost()})
    async with started(env, fakes) as run:
        while fakes.row.status.value != "FAILED" and not await run.in_renewal_wait(None):
            await env.sleep(10)
        if fakes.row.status.value == "FAILED":
            await run.handle.signal("retry")
        await run.until_active()
        await run.cancel()
        await _write_runs(env, run, name)


async def _main(suffix: str) -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_test_server(), data_converter=pydantic_data_converter
    )
    try:
        if suffix in ("", "unpatched"):
            await _row_moved_on(env, "row-moved-on" + (f"-{suffix}" if suffix else ""))
        elif suffix == "issuers":
            await _issuer_fallback(env, "issuer-fallback")
        elif suffix in ("renew-next-run", "renew-next-run-unpatched"):
            await _renew_while_handing_over(env, f"handing-over-{suffix}")
        elif suffix in ("lost-worker", "lost-worker-unpatched"):
            await _lost_worker(env, f"budget-{suffix}")
        else:
            await _long_dns_wait(env, f"long-dns-wait-{suffix}")
            await _failed_then_retried(env, f"failed-then-retried-{suffix}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else ""))
