"""Every run is brought to the current design (docs/changing-the-workflow.md,
"Retiring an old design"): a run of an older one continues as new in the current
design when it is about to start a durable wait (MIGRATE_AT_WAIT_PATCH), and the
``migrate`` signal changes nothing for a run of the current design."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from certflow.contract import CERTIFICATE_DESIGN
from certflow.models import Phase
from workflows.patches import CURRENT_DESIGN, OLDEST_SUPPORTED_DESIGN

from .fakes import DEFAULT, Fakes, Run, dns_cname_error, fail_first, gap, started


async def _runs(run: Run) -> list[dict[str, Any]]:
    """The input of each run of the workflow so far, in order (continue-as-new
    chains them)."""
    inputs = []
    history = await run.env.client.get_workflow_handle(run.handle.id, run_id=run.handle.first_execution_run_id).fetch_history()
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            inputs.append(json.loads(event.workflow_execution_started_event_attributes.input.payloads[0].data))
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            attributes = event.workflow_execution_continued_as_new_event_attributes
            inputs.append(json.loads(attributes.input.payloads[0].data))
    return inputs


async def test_an_older_design_continues_as_new_in_the_current_one_at_its_first_wait(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A run started on the oldest supported design reaches the current design at
    its first wait that a next run starts afresh (a DNS recheck here) and issues
    there; it takes no virtual time. Red without ``migrates=True`` on the recheck's
    ``_sleep`` (the run stays on its design: one run, until its next issuance)."""
    fakes = Fakes(workflow_env)
    fakes.behaviours["check_dns"] = fail_first(1, dns_cname_error)
    async with started(workflow_env, fakes, design=OLDEST_SUPPORTED_DESIGN) as run:
        before = await workflow_env.get_current_time()
        await run.until_active()
        runs = await _runs(run)
        assert [r.get("design") for r in runs] == [OLDEST_SUPPORTED_DESIGN, CURRENT_DESIGN], runs
        assert (await workflow_env.get_current_time() - before).total_seconds() < 60
        await run.cancel()


async def test_a_rate_limit_is_waited_out_before_the_migration(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A CA's Retry-After is never cut short by a migration: the older run waits
    it out in its own design (the next run would not know it). Red with
    ``migrates=True`` on ``_wait_for_cooldown``'s sleep (shown: the order placed
    again at once, ten minutes early)."""
    fakes = Fakes(workflow_env)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 600)
    async with started(workflow_env, fakes, design=OLDEST_SUPPORTED_DESIGN) as run:
        await run.until(lambda s: s.phase is Phase.WAITING_FOR_RATE_LIMIT, "the rate-limit wait")
        await run.signal("migrate")
        await workflow_env.sleep(300)
        assert len(fakes.of("place_order")) == 1
        await run.until_active(advance=60)
        orders = fakes.of("place_order")
        assert gap(orders[0], orders[1]) >= 600
        await run.cancel()


async def test_the_migrate_signal_changes_nothing_for_the_current_design(
    workflow_env: WorkflowEnvironment,
) -> None:
    """``starter.py migrate-runs`` signals every run: one of the current design
    goes on waiting where it was (no new run, the same wake-up), and is not woken
    early. Red when the signal's flag counts for every design (the wait ended at
    once and the attempt ran ten minutes early)."""
    fakes = Fakes(workflow_env)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 600)
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(lambda s: s.phase is Phase.WAITING_FOR_RATE_LIMIT, "the rate-limit wait")
        await run.signal("migrate")
        await workflow_env.sleep(300)
        state = await run.state()
        assert (state.phase, state.next_attempt_at) == (Phase.WAITING_FOR_RATE_LIMIT, waiting.next_attempt_at)
        assert len(fakes.of("place_order")) == 1
        assert [r.get("design") for r in await _runs(run)] == [CURRENT_DESIGN]
        await run.cancel()


async def test_the_status_names_the_design_the_run_follows(workflow_env: WorkflowEnvironment) -> None:
    """``starter.py migrate-runs --check`` counts runs by it: a run of design 3 says
    3 while its order is placed, and the run it continues as new after the
    issuance says 4. Red with ``design`` left out of ``_view`` (None)."""
    release = asyncio.Event()

    async def held(_: int, __: object) -> object:
        await release.wait()
        return DEFAULT

    fakes = Fakes(workflow_env, behaviours={"place_order": held})
    async with started(workflow_env, fakes, design=OLDEST_SUPPORTED_DESIGN) as run:
        await run.until_calls("place_order", 1)
        assert (await run.state()).design == OLDEST_SUPPORTED_DESIGN
        release.set()
        await run.until_active()
        assert (await run.state()).design == CURRENT_DESIGN
        await run.cancel()


def test_certflow_starts_the_current_design() -> None:
    """The design certflow's starts ask for (and ``migrate-runs --check`` counts
    against) is the one runs migrate to."""
    assert CERTIFICATE_DESIGN == CURRENT_DESIGN
