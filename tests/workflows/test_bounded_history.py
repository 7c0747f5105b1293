"""No run's history grows without bound, however long a certificate waits (issue:
bounded forever): a year of wrong DNS, four months of daily FAILED retries, six
hours of a CA cooldown repeating every 36 s, a week of an order the CA keeps pending, a flood
of renewal-window signals while waiting to renew, retry after retry during a long
cooldown. Each waiting loop continues as new once its run passes
HISTORY_EVENTS_BEFORE_NEW_RUN events, carrying what its waits need; each test is
red with its loop's check removed (said in its docstring).

Checked: with the bound raised out of reach (HISTORY_EVENTS_BEFORE_NEW_RUN =
10**9) the year of wrong DNS made one run of 6,704 events and failed here.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import AcmeStatus
from certflow.activity_payloads import OrderProgress
from certflow.workflow_payloads import RenewalWindow
from workflows.patches import HISTORY_EVENTS_BEFORE_NEW_RUN

from .fakes import (
    DEFAULT,
    FAST_POLICY,
    Fakes,
    active_row,
    Run,
    acme_temporary_error,
    app_error,
    dns_cname_error,
    started,
)

RUN_BOUND = 1000
"""The stated bound (docs/lifecycle.md): no run of a Certificate workflow above 1,000 events."""


async def _run_lengths(env: WorkflowEnvironment, run: Run) -> list[int]:
    """The number of events of every run of the workflow, first to current, following
    the continue-as-new links."""
    lengths = []
    run_id: str | None = run.handle.first_execution_run_id
    while run_id:
        history = await env.client.get_workflow_handle(run.handle.id, run_id=run_id).fetch_history()
        lengths.append(len(history.events))
        last = history.events[-1]
        run_id = None
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return lengths


async def _advance(env: WorkflowEnvironment, total: timedelta, step: timedelta) -> None:
    moved = timedelta(0)
    while moved < total:
        await env.sleep(step)
        moved += step


def _check(lengths: list[int], what: str, calls: int) -> None:
    print(f"\n{what}: {calls} attempts, {len(lengths)} runs, longest {max(lengths)} events")
    assert len(lengths) > 2, lengths  # it really continued as new, several times
    assert max(lengths) <= RUN_BOUND, lengths
    assert max(lengths[:-1]) > HISTORY_EVENTS_BEFORE_NEW_RUN, lengths  # and only when long


async def test_a_year_of_wrong_dns(workflow_env: WorkflowEnvironment) -> None:
    # Never abandoned here (PENDING_TIMEOUT_DAYS 0): the wait itself is under test.
    policy = FAST_POLICY.model_copy(
        update={
            "dns_recheck_initial_seconds": 3600,
            "dns_recheck_max_seconds": 86400,
            "pending_timeout_days": 0,
        }
    )
    fakes = Fakes(workflow_env, policy=policy)

    async def never_fixed(index: int, _: object) -> object:
        raise dns_cname_error()

    fakes.behaviours["check_dns"] = never_fixed
    async with started(workflow_env, fakes) as run:
        await _advance(workflow_env, timedelta(days=365), timedelta(days=30))
        checks = fakes.of("check_dns")
        assert len(checks) > 350
        # The backoff went on growing across runs (it is carried): daily at the end.
        last_gaps = [(b.at - a.at).total_seconds() for a, b in zip(checks[-5:], checks[-4:])]
        assert all(86400 <= g < 86400 + 60 for g in last_gaps), last_gaps
        state = await run.state()
        assert state.error_code is ErrorCode.DNS_CNAME and state.retry_count == 0
        _check(await _run_lengths(workflow_env, run), "a year of wrong DNS", len(checks))
        await run.cancel()


async def test_four_months_of_daily_failed_retries(workflow_env: WorkflowEnvironment) -> None:
    policy = FAST_POLICY.model_copy(
        update={
            "failed_retry_seconds": 86400,
            "failure_backoff_initial_seconds": 600,
            "failure_backoff_max_seconds": 600,
        }
    )
    fakes = Fakes(workflow_env, policy=policy)

    async def always(index: int, _: object) -> object:
        raise acme_temporary_error()

    fakes.behaviours["finalize_and_store"] = always
    async with started(workflow_env, fakes) as run:
        await _advance(workflow_env, timedelta(days=120), timedelta(days=30))
        reopened = fakes.of("reopen_failed")
        assert len(reopened) > 110  # every day, for four months
        state = await run.state()
        assert state.status.value == "FAILED"
        _check(await _run_lengths(workflow_env, run), "four months of daily FAILED retries", len(reopened))
        await run.cancel()


async def test_six_hours_of_a_cooldown_every_36_seconds(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env)

    async def limited(index: int, _: object) -> object:
        raise app_error(ErrorCode.ACME_RATE_LIMITED, "too many new orders", retry_after=36)

    fakes.behaviours["place_order"] = limited
    async with started(workflow_env, fakes) as run:
        await _advance(workflow_env, timedelta(hours=6), timedelta(hours=2))
        orders = fakes.of("place_order")
        assert len(orders) > 375  # ~ every 36-41 s (the cooldown, then its spread)
        state = await run.state()
        assert state.error_code is ErrorCode.ACME_RATE_LIMITED and state.retry_count == 0
        _check(await _run_lengths(workflow_env, run), "six hours of 36 s cooldowns", len(orders))
        await run.cancel()


async def test_a_week_of_an_order_the_ca_keeps_pending(workflow_env: WorkflowEnvironment) -> None:
    """The CA keeps the order pending for a simulated week (an incident), then makes
    it ready: every run stays under the bound while the poll goes on (every 10
    minutes, as the CA's Retry-After asks), the challenge is accepted once, no
    second order is placed, and
    the certificate is issued. Red before this change (BOUNDED_ORDER_POLL_PATCH's
    check removed): six simulated hours made one run of 4,043 events, a week would
    pass Temporal's 51,200-event limit (the workflow terminated)."""
    fakes = Fakes(workflow_env)
    begun = await workflow_env.get_current_time()
    ready_at = begun + timedelta(days=7)

    async def pending_for_a_week(index: int, arg: object) -> object:
        if await workflow_env.get_current_time() < ready_at:
            # The CA paces the polls (Retry-After: 600): ~1,000 polls in the week.
            return OrderProgress(status=AcmeStatus.PENDING, retry_after_seconds=600)
        return DEFAULT

    fakes.behaviours["wait_for_order"] = pending_for_a_week
    async with started(workflow_env, fakes) as run:
        await _advance(workflow_env, timedelta(days=7, hours=1), timedelta(hours=6))
        await run.until_active(serial_count=1, advance=60)
        polls = fakes.of("wait_for_order")
        assert len(polls) > 1000
        assert len(fakes.of("place_order")) == 1
        assert [p.arg.accept_first for p in polls].count(True) == 1  # accepted once
        _check(await _run_lengths(workflow_env, run), "a week of a pending order", len(polls))
        await run.cancel()


SIGNALS = 1200


async def test_a_flood_of_renewal_window_signals_while_waiting_to_renew(
    workflow_env: WorkflowEnvironment,
) -> None:
    """An ACTIVE certificate waiting for its renewal time gets 1,200 renewal_window
    signals, 50 at a time, each moving the window (the sweep misbehaving): the wait
    continues as new once long, every run under the bound, and it still waits for
    the latest window. Red with the history check of ``_sleep_until_renewal``
    removed: one run of 2,376 events for 800 signals (checked). 1,200: each signal
    is at least one event, so two runs of just over 500 cannot hold them all (with
    800 the workflow tasks batched enough signals once to leave two runs, [543,
    501], and the check below went red)."""
    t0 = await workflow_env.get_current_time()
    fakes = Fakes(workflow_env, row=active_row(t0, timedelta(days=90)))
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        last = None
        for n in range(SIGNALS):
            start = t0 + timedelta(days=40, minutes=n)
            last = RenewalWindow(serial="initial", start=start, end=start + timedelta(days=1))
            fakes.row.ari_window = (last.start, last.end)  # the sweep stores, then signals
            await run.signal("renewal_window", last)
            if n % 50 == 49:  # in bursts the sweep could never send: 50 at a time
                window = last
                state = await run.until(
                    lambda s: s.next_attempt_at is not None
                    and window.start <= s.next_attempt_at <= window.end,
                    "waiting for the burst's last window",
                )
        assert state.phase == "active; waiting for the renewal time"
        assert fakes.of("begin_renewal") == []
        _check(await _run_lengths(workflow_env, run), f"{SIGNALS} window signals", SIGNALS)
        await run.cancel()


async def test_retry_again_and_again_during_a_long_cooldown(workflow_env: WorkflowEnvironment) -> None:
    """A day-long cooldown and 250 ``retry`` signals (an impatient product): each
    only looks at the cooldown again, nothing is ordered, and every run stays under
    the bound. Red with BOUNDED_COOLDOWN_WAIT_PATCH's check removed: one run of
    3,034 events (checked). A retry that comes as a run hands over is carried to
    the next (CarriedWaits.retry_requested): one at a time, every one is seen."""
    fakes = Fakes(workflow_env)
    fakes.behaviours["place_order"] = fakes.rate_limited(10**6, 86400)
    async with started(workflow_env, fakes) as run:
        await run.until(lambda s: s.error_code is ErrorCode.ACME_RATE_LIMITED, "rate limited")
        for n in range(1, 251):  # one at a time: signals that arrive together are one retry
            await run.signal("retry")
            await run.until_calls("cooldown_remaining", n)
        assert len(fakes.of("place_order")) <= 1 + len(await _run_lengths(workflow_env, run))
        _check(await _run_lengths(workflow_env, run), "250 retries in a cooldown", 250)
        await run.cancel()
