"""What one issuance costs in Temporal (issue 25): the workflow tasks, activity
tasks, patch markers and search-attribute upserts of the run that issues, on the
design certflow starts (CERTIFICATE_DESIGN) and on the one a start naming no
design takes by one marker (UNNAMED_START_PATCH); a start of a retired design
fails its workflow task with the reason, and nothing runs.
"""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from certflow.workflow_payloads import CertificateInput
from certflow.contract import CERTIFICATE_DESIGN
from workflows.patches import FEWER_ROUND_TRIPS_DESIGN, UNNAMED_START_PATCH

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus

from .fakes import DEFAULT, HOSTNAME, Fakes, Row, app_error, started


async def _first_run(
    env: WorkflowEnvironment, input: CertificateInput | None = None, design: int | None = CERTIFICATE_DESIGN
) -> tuple[WorkflowHistory, Fakes]:
    fakes = Fakes(env)
    async with started(env, fakes, input, design=design) as run:
        await run.until_active()
        history = await env.client.get_workflow_handle(
            run.handle.id, run_id=run.handle.first_execution_run_id
        ).fetch_history()
    return history, fakes


def _activities(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def _count(history: WorkflowHistory, kind: EventType.ValueType) -> int:
    return sum(1 for e in history.events if e.event_type == kind)


def _patches(history: WorkflowHistory) -> list[str]:
    return [
        e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data.decode()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]


async def test_an_issuance_takes_two_activity_tasks_and_three_workflow_tasks(
    workflow_env: WorkflowEnvironment,
) -> None:
    history, fakes = await _first_run(workflow_env)

    # The row read and the DNS check ran (as local activities: markers, no tasks).
    assert fakes.names()[:2] == ["ensure_certificate", "check_dns"]
    assert _activities(history) == ["order_and_validate", "finalize_and_store"]
    assert _count(history, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) == 3
    assert _patches(history) == []


async def test_a_start_without_a_design_takes_design_4_by_one_marker(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A product's own ``start_workflow`` names no design: the first run takes
    UNNAMED_START_DESIGN by one patch marker and costs what certflow's starts cost.
    Red when ``design_of`` keeps the fewer-round-trips patch for such a start (it
    was so before: the run is then of design 2 and fails as retired)."""
    history, fakes = await _first_run(workflow_env, design=None)

    assert fakes.names()[:2] == ["ensure_certificate", "check_dns"]
    assert _activities(history) == ["order_and_validate", "finalize_and_store"]
    assert _count(history, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) == 3
    assert len(_patches(history)) == 1 and UNNAMED_START_PATCH in _patches(history)[0]


async def test_a_start_of_a_retired_design_fails_its_task_with_the_reason(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A run of a design this code no longer replays (here a start naming design 2)
    fails its first workflow task with RetiredDesign's message, and runs nothing:
    Temporal retries the task until a worker that knows the design takes it. Red
    with the check in ``design_of`` removed (the run issues on today's code)."""
    fakes = Fakes(workflow_env)
    input = CertificateInput(hostname=HOSTNAME, design=FEWER_ROUND_TRIPS_DESIGN)
    async with started(workflow_env, fakes, input) as run:
        failure = await run.until_workflow_task_failed()
        assert "design 2, which this worker no longer replays" in failure
        assert "migrate-runs" in failure
    assert fakes.names() == []


async def test_a_row_read_that_fails_locally_is_run_again_as_an_activity(
    workflow_env: WorkflowEnvironment,
) -> None:
    """A Postgres step that fails as a local activity (here at once; in production
    after a minute of retries) runs again as a regular one, whose retries cost no
    history."""
    fakes = Fakes(workflow_env)
    failed = False

    async def once_refused(index: int, _: object) -> object:
        nonlocal failed
        if not failed:
            failed = True
            raise app_error(ErrorCode.ACME_INVALID_ORDER, "refused once")
        return DEFAULT

    fakes.behaviours["ensure_certificate"] = once_refused
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        history = await workflow_env.client.get_workflow_handle(
            run.handle.id, run_id=run.handle.first_execution_run_id
        ).fetch_history()
    assert fakes.names()[:2] == ["ensure_certificate", "ensure_certificate"]
    assert _activities(history)[0] == "ensure_certificate"


async def test_the_dns_check_reads_the_row_again_after_a_wait(workflow_env: WorkflowEnvironment) -> None:
    """The first DNS check of a run is handed the method and tenant of the row read
    in the same workflow task (one statement fewer); after any wait it reads them
    itself, since a request or a transfer may have changed them: here a FAILED row
    read at the start, then ``retry``. Red when a read is taken as fresh for the
    rest of the run (``rows.just_read`` true once the row was read)."""
    fakes = Fakes(
        workflow_env,
        row=Row(status=CertificateStatus.FAILED, error_code=ErrorCode.ACME_INVALID_ORDER, retry_count=5),
    )
    async with started(workflow_env, fakes) as run:
        await run.until_calls("ensure_certificate", 1)
        await run.signal("retry")
        checks = await run.until_calls("check_dns", 1)
    assert checks[0].arg.row is None


async def test_the_first_dns_check_is_handed_the_row_just_read(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes) as run:
        checks = await run.until_calls("check_dns", 1)
    assert checks[0].arg.row is not None and checks[0].arg.row.tenant_id == fakes.row.tenant_id
