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

``kept-run``: every scenario above on the current design (the fakes start runs
of it), so that retiring the older designs keeps each path's replay, and a run of
the oldest supported design migrating at its first wait (``migrate-at-wait``).
``kept-run-unpatched``: the renew-next-run and lost-worker scenarios with those
patches' ``workflow.patched`` answering False and writing no marker, as the
code before them did: their old branches stay covered on the current design.
``start-in-design``: a start that names no design (a product's own
``start_workflow``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from temporalio import workflow
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
from workflows.patches import LOST_WORKER_PATCH, ORDER_IN_ONE_STEP_DESIGN, RENEW_NEXT_RUN_PATCH
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
    _write(f"{name}-1", history, len(history.events))


def _write(name: str, history: object, events: int) -> None:
    path = HISTORIES / f"{name}.json"
    if path.exists():
        raise FileExistsError(f"{path} is checked in: record under a new suffix")
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")  # type: ignore[attr-defined]
    print(f"wrote {path.name} ({events} events)")


async def _long_dns_wait(env: WorkflowEnvironment, name: str) -> None:
    """Wrong DNS long enough for a run to pass the bound and continue as new
    (bounded history): both runs, the first ending in continue-as-new."""
    policy = FAST_POLICY.model_copy(
        update={"dns_recheck_initial_seconds": 3600, "dns_recheck_max_seconds": 3600}
    )
    fakes = Fakes(env, policy=policy, behaviours={"check_dns": fail_first(60, dns_cname_error)})
    async with started(env, fakes) as run:
        await run.until_active(advance=timedelta(hours=6), timeout=180)
        await run.cancel()
        await _write_runs(env, run, name)


async def _failed_then_retried(env: WorkflowEnvironment, name: str) -> None:
    """Three failed attempts, FAILED, retry, ACTIVE (the FAILED path after the
    self-check patch: no one DNS lets a real CA fail what the self-check passes)."""
    fakes = Fakes(env, behaviours={"finalize_and_store": fail_first(3, acme_temporary_error)})
    async with started(env, fakes) as run:
        await run.until(lambda s: s.status.value == "FAILED", "FAILED", advance=10)
        await run.handle.signal("retry")
        await run.until_active()
        await run.cancel()
        await _write_runs(env, run, name)


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


async def _migrate_at_wait(env: WorkflowEnvironment, name: str) -> None:
    """A run of the oldest supported design whose first DNS check fails: it
    continues as new in the current design instead of waiting for the recheck
    (MIGRATE_AT_WAIT_PATCH), and the next run issues."""
    fakes = Fakes(env, behaviours={"check_dns": fail_first(1, dns_cname_error)})
    async with started(env, fakes, design=ORDER_IN_ONE_STEP_DESIGN) as run:
        await run.until_active()
        await run.cancel()
        await _write_runs(env, run, name)


async def _start_in_design(env: WorkflowEnvironment, name: str) -> None:
    """A start that names no design, issued; both runs up to the renewal wait."""
    fakes = Fakes(env)
    async with started(env, fakes, design=None) as run:
        await run.until_active()
        await run.cancel()
        await _write_runs(env, run, name)


@contextmanager
def _before(*patches: str) -> Iterator[None]:
    """``workflow.patched`` answers False for these patches and writes no marker,
    as the code before them did (the sandbox passes temporalio through)."""
    real = workflow.patched

    def patched(patch_id: str) -> bool:
        return False if patch_id in patches else real(patch_id)

    workflow.patched = patched  # type: ignore[assignment]
    try:
        yield
    finally:
        workflow.patched = real


async def _current_design(env: WorkflowEnvironment, suffix: str) -> None:
    """Every scenario of this file on the current design."""
    await _row_moved_on(env, f"row-moved-on-{suffix}")
    await _issuer_fallback(env, f"issuer-fallback-{suffix}")
    await _renew_while_handing_over(env, f"handing-over-renew-next-run-{suffix}")
    await _lost_worker(env, f"budget-lost-worker-{suffix}")
    await _long_dns_wait(env, f"long-dns-wait-{suffix}")
    await _failed_then_retried(env, f"failed-then-retried-{suffix}")
    await _migrate_at_wait(env, f"migrate-at-wait-{suffix}")


async def _main(suffix: str) -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_test_server(), data_converter=pydantic_data_converter
    )
    try:
        if suffix == "kept-run":
            await _current_design(env, suffix)
        elif suffix == "kept-run-unpatched":
            with _before(RENEW_NEXT_RUN_PATCH, LOST_WORKER_PATCH):
                await _renew_while_handing_over(env, f"handing-over-renew-next-run-{suffix}")
                await _lost_worker(env, f"budget-lost-worker-{suffix}")
        elif suffix == "start-in-design":
            await _start_in_design(env, suffix)
        elif suffix in ("", "unpatched"):
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
