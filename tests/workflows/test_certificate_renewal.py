"""Renewal (docs/lifecycle.md, "The lifecycle") on the time-skipping test server: when it happens (1/3 rule,
1/2 under 10 days, ARI window), renewal cycles with continue-as-new, and expiry
during a renewal that keeps failing.

See ``fakes.py`` for the fakes, the in-memory row and how time skipping is used.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, OrderKind
from certflow.workflow_payloads import RenewalWindow
from workflows.patches import (
    ORDER_IN_ONE_STEP_DESIGN,
    RUN_KEPT_AFTER_ISSUANCE_DESIGN,
    RUN_KEPT_BELOW_EVENTS,
)

from .fakes import (
    renewal_at,
    ACTIVE_RUN_STEPS,
    AFTER_ISSUANCE_STEPS,
    HAPPY_STEPS,
    ATTEMPT_STEPS,
    CERT_ID,
    DEFAULT,
    FAST_POLICY,
    Fakes,
    acme_temporary_error,
    active_row,
    started,
)

ACTIVE = CertificateStatus.ACTIVE
RENEWING = CertificateStatus.RENEWING
EXPIRED = CertificateStatus.EXPIRED
MINUTE = timedelta(minutes=1)


@pytest.mark.parametrize(
    ("lifetime", "renew_after"),
    [
        pytest.param(timedelta(days=90), timedelta(days=60), id="90-days-at-1/3-left"),
        pytest.param(timedelta(days=6), timedelta(days=3), id="6-days-at-1/2-left"),
    ],
)
async def test_renews_when_the_rule_says(
    workflow_env: WorkflowEnvironment, lifetime: timedelta, renew_after: timedelta
) -> None:
    t0 = await workflow_env.get_current_time()
    fakes = Fakes(workflow_env, row=active_row(t0, lifetime), lifetime=lifetime)
    async with started(workflow_env, fakes) as run:
        state = await run.until_active()
        assert fakes.names() == ACTIVE_RUN_STEPS
        renew_at = renewal_at(t0, t0 + lifetime)
        # The rule's mark, less up to 10 % of the time before it (spread per certificate).
        assert t0 + renew_after * 0.9 <= renew_at <= t0 + renew_after
        assert state.next_attempt_at == renew_at
        assert state.expires_at == t0 + lifetime

        await run.sleep_until(renew_at - timedelta(hours=1))
        assert "begin_renewal" not in fakes.names()
        await workflow_env.sleep(timedelta(hours=2))

        (begun,) = fakes.of("begin_renewal")
        assert renew_at <= begun.at < renew_at + MINUTE
        state = await run.until_active(serial_count=1)
        (issued,) = fakes.issued
        assert issued.serial_hex != "initial"
        assert state.expires_at == issued.not_after
        assert state.next_attempt_at == renewal_at(issued.not_before, issued.not_after)
        assert fakes.names() == [
            *ACTIVE_RUN_STEPS,
            "begin_renewal",
            *ATTEMPT_STEPS,
            *AFTER_ISSUANCE_STEPS,
        ]
        assert "record_failure" not in fakes.names()
        await run.cancel()


async def test_renews_inside_the_ari_window(workflow_env: WorkflowEnvironment) -> None:
    """The renewal-info sweep stores the CA's window and signals the workflow, which
    plans its renewal inside it (no activity of its own asks the CA)."""
    t0 = await workflow_env.get_current_time()
    start, end = t0 + timedelta(days=20), t0 + timedelta(days=22)
    fakes = Fakes(workflow_env, row=active_row(t0, timedelta(days=90)))
    async with started(workflow_env, fakes) as run:
        state = await run.until_active()
        # No window yet: the 1/3 rule (spread per certificate).
        assert state.next_attempt_at == renewal_at(t0, t0 + timedelta(days=90))

        await run.sleep_until(t0 + timedelta(days=1))
        fakes.row.ari_window = (start, end)
        await run.handle.signal(
            "renewal_window", RenewalWindow(start=start, end=end, serial="initial")
        )
        state = await run.until(
            lambda s: s.next_attempt_at is not None and s.next_attempt_at < t0 + timedelta(days=30),
            "planned inside the window",
        )
        planned = state.next_attempt_at
        assert planned == renewal_at(t0, t0 + timedelta(days=90), (start, end))
        assert start <= planned <= end

        await run.sleep_until(end + timedelta(hours=1))
        (begun,) = fakes.of("begin_renewal")
        assert planned <= begun.at < planned + MINUTE
        (placed,) = fakes.of("place_order")
        assert placed.arg.kind is OrderKind.ARI_RENEWAL  # exempt from the CA's limits
        state = await run.until_active(serial_count=1)
        # The new certificate: no window for it yet, so the 1/3 rule again.
        (issued,) = fakes.issued
        assert state.next_attempt_at == renewal_at(issued.not_before, issued.not_after)
        assert "renewal_info" not in fakes.names()
        await run.cancel()


async def test_the_window_asked_at_issuance_is_slept_to_without_a_signal(
    workflow_env: WorkflowEnvironment,
) -> None:
    """finalize_and_store asks the CA's ARI for the new certificate; the run after the
    issuance sleeps straight into that window, reading nothing and waiting for no
    signal (the steady bill: no activity, no signal per renewal cycle).

    Fails with the issued window dropped in the workflow (the 1/3 rule is planned
    instead) or with the next run reading the row again (ensure_certificate called).
    """
    fakes = Fakes(workflow_env, first_window=(timedelta(days=50), timedelta(days=52)))
    async with started(workflow_env, fakes) as run:
        state = await run.until_active(serial_count=1)
        (issued,) = fakes.issued
        assert issued.ari_window_start and issued.ari_window_end
        window = (issued.ari_window_start, issued.ari_window_end)
        assert state.next_attempt_at == renewal_at(issued.not_before, issued.not_after, window)
        assert window[0] <= state.next_attempt_at <= window[1]
        assert state.next_attempt_at != renewal_at(issued.not_before, issued.not_after)
        assert fakes.names() == HAPPY_STEPS

        await run.sleep_until(window[1] + timedelta(hours=1))
        (placed,) = fakes.of("place_order")[1:]
        assert placed.arg.kind is OrderKind.ARI_RENEWAL  # the stored window counts
        await run.until_active(serial_count=2)
        await run.cancel()


async def test_a_renewal_after_an_issuance_reads_the_policy_the_worker_has_now(
    workflow_env: WorkflowEnvironment,
) -> None:
    """The run after an issuance starts from the carried row and policy, and reads
    both again when it renews: a setting changed in the months between (here the
    self-check turned off) applies to the renewal.

    Fails with the read before the renewal removed (the carried policy still has the
    self-check on: check_http01 is called again).
    """
    fakes = Fakes(workflow_env)
    async with started(workflow_env, fakes) as run:
        await run.until_active(serial_count=1)
        assert len(fakes.of("check_http01")) == 1
        fakes.policy = fakes.policy.model_copy(update={"http01_self_check": False})
        await run.handle.signal("renew")
        await run.until_active(serial_count=2)
        assert len(fakes.of("check_http01")) == 1  # not asked again: the new policy
        renewed_at = fakes.names().index("begin_renewal")
        assert fakes.names()[renewed_at - 1] == "ensure_certificate"
        await run.cancel()


async def test_a_window_in_the_past_renews_now(workflow_env: WorkflowEnvironment) -> None:
    """ARI's answer for a revoked certificate: a window in the past, renew at once."""
    t0 = await workflow_env.get_current_time()
    fakes = Fakes(workflow_env, row=active_row(t0, timedelta(days=90)))
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        await run.sleep_until(t0 + timedelta(days=3))
        past = (t0 + timedelta(days=1), t0 + timedelta(days=2))
        fakes.row.ari_window = past
        signalled = await run.now()
        await run.handle.signal(
            "renewal_window", RenewalWindow(start=past[0], end=past[1], serial="initial")
        )
        (begun,) = await run.until_calls("begin_renewal", 1)
        assert (begun.at - signalled).total_seconds() < 60
        await run.until_active(serial_count=1)
        await run.cancel()


async def test_a_manual_renewal_is_not_counted_as_an_ari_renewal(
    workflow_env: WorkflowEnvironment,
) -> None:
    t0 = await workflow_env.get_current_time()
    window = (t0 + timedelta(days=20), t0 + timedelta(days=22))
    row = active_row(t0, timedelta(days=90))
    row.ari_window = window
    fakes = Fakes(workflow_env, row=row)
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        await run.handle.signal("renew")
        (placed,) = await run.until_calls("place_order", 1)
        assert placed.arg.kind is OrderKind.RENEWAL  # before its ARI window: a plain renewal
        await run.until_active(serial_count=1)
        await run.cancel()


@pytest.mark.parametrize(
    ("lifetime", "renew_after"),
    [
        pytest.param(timedelta(days=90), timedelta(days=60), id="90-days"),
        pytest.param(timedelta(days=6), timedelta(days=3), id="6-days"),
    ],
)
async def test_three_renewal_cycles_each_renew_at_their_time(
    workflow_env: WorkflowEnvironment, lifetime: timedelta, renew_after: timedelta
) -> None:
    """Each cycle renews at its time with a new certificate. A run of
    ORDER_IN_ONE_STEP_DESIGN continues as new into the current design before its
    first renewal wait (MIGRATE_AT_WAIT_PATCH), and that run keeps itself after
    its issuances (RUN_KEPT_AFTER_ISSUANCE_DESIGN): one run for the three cycles."""
    t0 = await workflow_env.get_current_time()
    fakes = Fakes(workflow_env, row=active_row(t0, lifetime), lifetime=lifetime)
    async with started(workflow_env, fakes, design=ORDER_IN_ONE_STEP_DESIGN) as run:
        # The run of design 4 it migrates into reads the row: on its timer only then
        # (a time skip that meets the continue-as-new can hang the test server).
        await run.until_calls("ensure_certificate", 2)
        await run.until_active()
        run_ids = [await run.run_id()]
        serials = {"initial"}
        for cycle in range(1, 4):
            assert fakes.row.not_before is not None
            assert fakes.row.expires_at is not None
            renew_at = renewal_at(fakes.row.not_before, fakes.row.expires_at)
            await run.sleep_until(renew_at + renew_after / 10)
            state = await run.until_active(serial_count=cycle)

            begun = fakes.of("begin_renewal")
            assert len(begun) == cycle
            assert renew_at <= begun[-1].at < renew_at + MINUTE
            new = fakes.issued[-1]
            assert new.serial_hex not in serials  # a NEW certificate each time
            serials.add(new.serial_hex)
            assert state.status is ACTIVE
            assert state.expires_at == new.not_after
            assert new.not_before >= renew_at
            run_id = await run.run_id()
            if run_id != run_ids[-1]:
                run_ids.append(run_id)
        assert len(run_ids) == 1  # migrated before the first wait; kept since

        lengths = []
        for run_id in run_ids:
            history = await workflow_env.client.get_workflow_handle(
                run.handle.id, run_id=run_id
            ).fetch_history()
            lengths.append(len(history.events))
        print(f"{lifetime.days}-day certificate: history lengths of the runs {lengths}")
        assert all(n < 100 for n in lengths), lengths
        # The first run reads the row, and so does the run it migrated into; after an
        # issuance the run goes on from the row it stored and reads it again (with
        # the worker's policy) only when it renews.
        assert len(fakes.of("ensure_certificate")) == 4
        await run.cancel()


async def test_expiry_during_a_failing_renewal_then_the_ca_recovers(
    workflow_env: WorkflowEnvironment,
) -> None:
    t0 = await workflow_env.get_current_time()
    lifetime = timedelta(days=6)
    expires = t0 + lifetime
    policy = FAST_POLICY.model_copy(
        update={
            "failure_backoff_initial_seconds": 12 * 3600,
            "failure_backoff_max_seconds": 24 * 3600,
            "max_failures": 10,
            "failed_retry_seconds": 86400,
        }
    )
    ca_down = True

    async def finalize(_: int, __: Any) -> Any:
        if ca_down:
            raise acme_temporary_error()
        return DEFAULT

    fakes = Fakes(
        workflow_env,
        row=active_row(t0, lifetime),
        lifetime=lifetime,
        policy=policy,
        behaviours={"finalize_and_store": finalize},
    )
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        await run.sleep_until(t0 + timedelta(days=3, hours=1))
        state = await run.state()
        # Renewing: the old certificate stays in place while attempts fail.
        assert state.status is RENEWING
        assert state.expires_at == expires
        assert state.error_code is ErrorCode.ACME_TEMPORARY
        assert state.retry_count == 1
        assert "mark_expired" not in fakes.names()

        await run.sleep_until(expires + timedelta(hours=2))
        (expired,) = fakes.of("mark_expired")
        assert expired.arg == CERT_ID
        assert expires <= expired.at < expires + MINUTE  # woken for the expiry, not later
        state = await run.state()
        assert state.status is EXPIRED
        assert fakes.row.status is EXPIRED
        outcomes = fakes.outcomes()
        before = [c for c in fakes.of("record_failure") if c.at < expired.at]
        assert before and all(c.arg.outcome.status is RENEWING for c in before)
        assert outcomes[-1].status is EXPIRED
        assert [o.retry_count for o in outcomes] == list(range(1, len(outcomes) + 1))
        assert fakes.issued == []

        ca_down = False  # the CA recovers; "retry now" cuts the backoff short
        await run.handle.signal("retry")
        state = await run.until_active(serial_count=1)
        (issued,) = fakes.issued
        assert state.status is ACTIVE
        assert state.expires_at == issued.not_after > expires
        assert state.error_code is None and state.retry_count == 0
        # The kept order of the renewal was finalized: one order for the whole renewal.
        assert len(fakes.of("place_order")) == 1
        assert "reopen_failed" not in fakes.names()
        await run.cancel()




async def test_a_window_for_the_replaced_certificate_changes_nothing(
    workflow_env: WorkflowEnvironment,
) -> None:
    """The sweep read the old certificate's window just before the renewal stored a new
    one: its signal must not make the new certificate renew again at once."""
    t0 = await workflow_env.get_current_time()
    fakes = Fakes(workflow_env, row=active_row(t0, timedelta(days=90)))
    async with started(workflow_env, fakes) as run:
        before = await run.until_active()
        past = (t0 - timedelta(days=2), t0 - timedelta(days=1))
        await run.handle.signal(
            "renewal_window", RenewalWindow(start=past[0], end=past[1], serial="replaced")
        )
        await workflow_env.sleep(timedelta(hours=1))
        assert "begin_renewal" not in fakes.names()
        assert (await run.state()).next_attempt_at == before.next_attempt_at
        await run.cancel()


async def test_renewal_cycles_stay_in_one_run_until_its_history_is_long(
    workflow_env: WorkflowEnvironment,
) -> None:
    """RUN_KEPT_AFTER_ISSUANCE_DESIGN: a renewal cycle starts no run while the run's
    history is shorter than RUN_KEPT_BELOW_EVENTS; the issuance that ends past it
    continues as new, so no run grows much beyond it. Fifteen cycles of 6-day
    certificates, each renewing with a new certificate. Red with the run not kept:
    sixteen runs; red without the bound: one run of ~300 events."""
    lifetime = timedelta(days=6)
    t0 = await workflow_env.get_current_time()
    fakes = Fakes(workflow_env, row=active_row(t0, lifetime), lifetime=lifetime)
    async with started(workflow_env, fakes, design=RUN_KEPT_AFTER_ISSUANCE_DESIGN) as run:
        await run.until_active()
        run_ids = [await run.run_id()]
        for cycle in range(1, 16):
            assert fakes.row.not_before is not None and fakes.row.expires_at is not None
            renew_at = renewal_at(fakes.row.not_before, fakes.row.expires_at)
            await run.sleep_until(renew_at + timedelta(hours=8))
            await run.until_active(serial_count=cycle)
            run_id = await run.run_id()
            if run_id != run_ids[-1]:
                run_ids.append(run_id)
        lengths = [
            len((await workflow_env.client.get_workflow_handle(run.handle.id, run_id=r).fetch_history()).events)
            for r in run_ids
        ]
        print(f"15 renewal cycles: history lengths of the runs {lengths}")
        assert len(run_ids) == 2, lengths
        assert all(n < RUN_KEPT_BELOW_EVENTS + 60 for n in lengths), lengths
        assert len(fakes.issued) == 15
        await run.cancel()
