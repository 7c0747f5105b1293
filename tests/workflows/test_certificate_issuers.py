"""Choosing and falling back between issuers (CAs), on the time-skipping server.

The issuers CAA allows come from check_dns; the workflow orders from the first of
them, and passes over one that cannot issue — a cooldown longer than the setting,
the failure budget spent, no answer for longer than the setting — to the next, at
once and with the reason recorded. A renewal stays with the CA of its certificate.
With one issuer (or none known: histories from before issuers) nothing falls back.

Each guarantee was checked to fail with its guard removed: with ``_fall_back``
always False the cooldown and budget tests wait on A / end FAILED; with
``choose_issuer`` ignoring ``preferred`` the renewal goes to A.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, OrderKind
from certflow.activity_payloads import DnsVerdict

from .fakes import (
    FAST_POLICY,
    Fakes,
    active_row,
    app_error,
    gap,
    invalid_order_error,
    returns,
    started,
)

TWO = FAST_POLICY.model_copy(
    update={"issuers": ["a", "b"], "issuer_fallback_cooldown_seconds": 3600}
)


def _issuers(fakes: Fakes) -> list[str | None]:
    return [c.arg.issuer for c in fakes.of("place_order")]


async def test_caa_allowing_only_b_orders_from_b(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, policy=TWO)
    fakes.behaviours["check_dns"] = returns(DnsVerdict(allowed_issuers=["b"]))
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        assert _issuers(fakes) == ["b"]
        (placed,) = fakes.of("place_order")
        assert placed.arg.issuer_reason == "CAA does not allow a"
        assert [c.arg.issuer for c in fakes.of("wait_for_order")] == ["b"]
        assert [c.arg.issuer for c in fakes.of("finalize_and_store")] == ["b"]
        assert fakes.row.issuer == "b"
        assert (await run.state()).issuer == "b"
        await run.cancel()


async def test_a_long_cooldown_at_a_falls_back_to_b_at_once(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, policy=TWO)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 7200)  # 2 h > the 1 h setting
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        assert _issuers(fakes) == ["a", "b"]
        first, second = fakes.of("place_order")
        assert gap(first, second) < 60  # no wait for A's cooldown
        reason = second.arg.issuer_reason or ""
        assert reason.startswith("fell back from a, rate-limited until "), reason
        assert "too many new orders recently" in reason
        (outcome,) = fakes.outcomes()
        assert outcome.status is CertificateStatus.PENDING and outcome.retry_count == 0
        assert fakes.row.issuer == "b"
        await run.cancel()


async def test_a_short_cooldown_waits_for_a(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, policy=TWO)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 600)  # under the setting
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=60)
        assert _issuers(fakes) == ["a", "a"]
        first, second = fakes.of("place_order")
        assert gap(first, second) >= 600
        await run.cancel()


async def test_one_issuer_never_falls_back(workflow_env: WorkflowEnvironment) -> None:
    one = TWO.model_copy(update={"issuers": ["a"]})
    fakes = Fakes(workflow_env, policy=one)
    fakes.behaviours["place_order"] = fakes.rate_limited(1, 7200)
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=600)
        first, second = fakes.of("place_order")
        assert _issuers(fakes) == ["a", "a"] and gap(first, second) >= 7200
        await run.cancel()


async def test_a_spent_budget_at_a_falls_back_to_b_not_failed(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env, policy=TWO)
    fakes.behaviours["wait_for_order"] = lambda index, arg: _fail_at(arg.issuer == "a")
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=30)
        assert _issuers(fakes) == ["a", "a", "a", "b"]
        outcomes = fakes.outcomes()
        assert [o.retry_count for o in outcomes] == [1, 2, 0]
        assert all(o.status is not CertificateStatus.FAILED for o in outcomes)
        reason = fakes.of("place_order")[-1].arg.issuer_reason or ""
        assert reason.startswith("fell back from a, ACME_INVALID_ORDER after 3 attempts"), reason
        assert gap(fakes.of("record_failure")[-1], fakes.of("place_order")[-1]) < 60
        await run.cancel()


async def test_the_budget_spent_at_every_issuer_is_failed(workflow_env: WorkflowEnvironment) -> None:
    fakes = Fakes(workflow_env, policy=TWO)
    fakes.behaviours["wait_for_order"] = lambda index, arg: _fail_at(True)
    async with started(workflow_env, fakes) as run:
        await run.until(lambda s: s.status is CertificateStatus.FAILED, "FAILED", advance=30)
        assert _issuers(fakes) == ["a", "a", "a", "b", "b", "b"]
        await run.cancel()


async def test_failed_everywhere_then_retried_starts_a_new_round(
    workflow_env: WorkflowEnvironment,
) -> None:
    """FAILED after both issuers' budgets, then ``retry``: a new round from the
    first, and a fallback to the second again (not FAILED at the first alone)."""
    fakes = Fakes(workflow_env, policy=TWO)
    fakes.behaviours["wait_for_order"] = lambda index, arg: _fail_at(index < 9)
    async with started(workflow_env, fakes) as run:
        await run.until(lambda s: s.status is CertificateStatus.FAILED, "FAILED", advance=30)
        await run.handle.signal("retry")
        await run.until_active(advance=30)
        assert _issuers(fakes) == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"]
        assert fakes.row.issuer == "b"
        await run.cancel()


async def test_an_unreachable_ca_falls_back_after_the_setting(workflow_env: WorkflowEnvironment) -> None:
    policy = TWO.model_copy(
        update={"max_failures": 20, "issuer_fallback_unreachable_seconds": 300}
    )
    fakes = Fakes(workflow_env, policy=policy)

    async def unreachable(index: int, arg: object) -> object:
        if getattr(arg, "issuer") == "a":
            error = app_error(ErrorCode.ACME_TEMPORARY, "cannot reach the CA: ConnectionError")
            error.details[0]["unreachable"] = True
            raise error
        from .fakes import DEFAULT

        return DEFAULT

    fakes.behaviours["place_order"] = unreachable
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=30)
        calls = fakes.of("place_order")
        at_a = [c for c in calls if c.arg.issuer == "a"]
        assert calls[-1].arg.issuer == "b"
        assert gap(at_a[0], at_a[-1]) >= 300  # A was given the whole setting
        reason = calls[-1].arg.issuer_reason or ""
        assert reason.startswith("fell back from a, unreachable since "), reason
        await run.cancel()


async def _renewing_at_b(env: WorkflowEnvironment) -> Fakes:
    """An ACTIVE certificate of issuer b, 80 days into its 90: it renews at once."""
    now = await env.get_current_time()
    row = active_row(now - timedelta(days=80), timedelta(days=90))
    row.issuer = row.order_issuer = "b"
    return Fakes(env, row=row, policy=TWO)


async def test_a_renewal_stays_with_the_ca_of_its_certificate(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = await _renewing_at_b(workflow_env)
    async with started(workflow_env, fakes) as run:
        await run.until_active(serial_count=1, advance=3600)
        (placed,) = fakes.of("place_order")
        assert placed.arg.issuer == "b"
        assert placed.arg.kind is OrderKind.RENEWAL  # `replaces` only applies there
        assert placed.arg.issuer_reason == "the renewal stays with the CA of the current certificate"
        await run.cancel()


async def test_a_renewal_at_another_ca_is_a_new_order_there(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = await _renewing_at_b(workflow_env)
    fakes.behaviours["check_dns"] = returns(DnsVerdict(allowed_issuers=["a"]))  # CAA changed
    async with started(workflow_env, fakes) as run:
        await run.until_active(serial_count=1, advance=3600)
        (placed,) = fakes.of("place_order")
        assert (placed.arg.issuer, placed.arg.kind) == ("a", OrderKind.NEW)
        assert fakes.row.issuer == "a"
        await run.cancel()


async def _fail_at(failing: bool) -> object:
    from .fakes import DEFAULT

    if failing:
        raise invalid_order_error()
    return DEFAULT
