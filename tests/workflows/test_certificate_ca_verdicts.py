"""The workflow believes the CA's verdicts as Let's Encrypt gives them.

A CA refusing on CAA after our check allowed (ACME_CAA) is a failed authorization
at the CA (Boulder's ra.go countFailedValidations): it counts in the budget, our
reading of CAA then is remembered, and no new order goes to that CA until the
reading changes (or ``retry``).

An ARI window is believed once: a certificate an hour old or less whose window is
already open renews once; when its replacement gets such a window too, that is a
CA telling us to renew for ever (an incident, a bug), and it waits for the
renewal-info sweep's next answer.

See ``fakes.py`` for the fakes, the in-memory row and how time skipping is used.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, OrderKind, Phase
from certflow.activity_payloads import DnsVerdict
from certflow.workflow_payloads import RenewalWindow

from .fakes import DEFAULT, FAST_POLICY, Fakes, active_row, app_error, started

READING_BEFORE = 'CAA at edge.test (via x.test → edge.test): 0 issue "letsencrypt.org"'
READING_AFTER = 'CAA at edge.test (via x.test → edge.test): 0 issue "other.test"; 0 issue "letsencrypt.org"'
CA_DETAIL = "While processing CAA for x.test: CAA record for x.test prevents issuance"


def ca_caa_refusal() -> Any:
    return app_error(
        ErrorCode.ACME_CAA, f"the CA's CAA check refused although ours allowed: {CA_DETAIL}"
    )


async def test_a_ca_caa_refusal_counts_once_and_orders_nothing_until_caa_changes(
    workflow_env: WorkflowEnvironment,
) -> None:
    """The CA's validation fails with ``caa``: one failure counted (retry_count 1),
    then DNS re-checks every backoff for six simulated hours order nothing while our
    reading is unchanged; once it changes, one new order, ACTIVE. Red before this
    change: ``caa`` was DNS_CAA, re-checked with the budget untouched, and every
    re-check ordered again (one failed authorization each)."""
    fakes = Fakes(workflow_env, policy=FAST_POLICY.model_copy(update={"issuers": ["default"]}))
    reading = [READING_BEFORE]

    async def check_dns(index: int, _: Any) -> DnsVerdict:
        return DnsVerdict(allowed_issuers=["default"], caa_reading=reading[0])

    async def wait_for_order(index: int, _: Any) -> Any:
        if index == 0:
            raise ca_caa_refusal()
        return DEFAULT

    fakes.behaviours["check_dns"] = check_dns
    fakes.behaviours["wait_for_order"] = wait_for_order
    async with started(workflow_env, fakes) as run:
        refused = await run.until(
            lambda s: s.error_code is ErrorCode.DNS_CAA, "the disagreement held", advance=30
        )
        assert refused.retry_count == 1  # the CA's refusal counted, once
        assert refused.status is CertificateStatus.PENDING
        assert "refused on CAA although our check allows it" in (refused.error_message or "")
        assert READING_BEFORE in (refused.error_message or "")
        assert [o.error_code for o in fakes.outcomes()][:1] == [ErrorCode.ACME_CAA]
        start = await run.now()
        while await run.now() < start + timedelta(hours=6):
            await workflow_env.sleep(timedelta(minutes=20))
        rechecks = len(fakes.of("check_dns"))
        print(f"\n[ACME_CAA] {rechecks} DNS checks over six hours, orders {fakes.orders_created}")
        assert rechecks >= 6  # the DNS backoff (1 min doubling to 1 h) kept looking
        assert fakes.orders_created == 1
        assert (await run.state()).retry_count == 1  # re-checks spend nothing

        reading[0] = READING_AFTER
        await run.until_active(advance=60)
        assert fakes.orders_created == 2


async def test_retry_orders_again_despite_the_disagreement(workflow_env: WorkflowEnvironment) -> None:
    """An operator's ``retry`` lifts the hold at once (the operator says CAA is fixed)."""
    fakes = Fakes(workflow_env, policy=FAST_POLICY.model_copy(update={"issuers": ["default"]}))

    async def check_dns(index: int, _: Any) -> DnsVerdict:
        return DnsVerdict(allowed_issuers=["default"], caa_reading=READING_BEFORE)

    async def wait_for_order(index: int, _: Any) -> Any:
        if index == 0:
            raise ca_caa_refusal()
        return DEFAULT

    fakes.behaviours["check_dns"] = check_dns
    fakes.behaviours["wait_for_order"] = wait_for_order
    async with started(workflow_env, fakes) as run:
        await run.until(lambda s: s.error_code is ErrorCode.DNS_CAA, "the hold", advance=30)
        assert fakes.orders_created == 1
        await run.handle.signal("retry")
        await run.until_active()
        assert fakes.orders_created == 2


async def test_an_open_window_on_a_fresh_certificate_renews_once_not_in_a_loop(
    workflow_env: WorkflowEnvironment,
) -> None:
    """The CA answers every new certificate's first ARI question with a window that
    closed an hour before it was issued (fakes.first_window): the first certificate renews at once,
    the second waits for the sweep's next answer. Over a simulated day: two orders
    (issuance, one renewal), the second certificate held in its own phase. Red
    before this change (ARI_ONCE_PER_WINDOW_PATCH's branch removed): a renewal every
    few seconds, hundreds of orders a day."""
    fakes = Fakes(workflow_env)
    fakes.first_window = (timedelta(hours=-2), timedelta(hours=-1))  # over before issuance
    async with started(workflow_env, fakes) as run:
        await run.until(
            lambda s: s.phase == Phase.WAITING_FOR_RENEWAL_INFO, "the hold", advance=5
        )
        start = await run.now()
        while await run.now() < start + timedelta(days=1):
            await workflow_env.sleep(timedelta(hours=2))
        print(f"\n[ARI at once] orders over a simulated day: {fakes.orders_created}")
        assert fakes.orders_created == 2
        assert len(fakes.issued) == 2
        state = await run.state()
        assert state.phase == Phase.WAITING_FOR_RENEWAL_INFO
        # The sweep's next answer decides: a window that moved renews, once more; the
        # replacement, given a window in the past again, is held at once.
        await run.handle.signal(
            "renewal_window",
            RenewalWindow(serial=fakes.issued[-1].serial_hex, start=await run.now(), end=await run.now() + timedelta(hours=1)),
        )
        await run.until_calls("place_order", 3, advance=5)
        await run.until(
            lambda s: s.phase == Phase.WAITING_FOR_RENEWAL_INFO and len(fakes.issued) == 3,
            "the third certificate held",
            advance=5,
        )
        await workflow_env.sleep(timedelta(hours=6))
        assert fakes.orders_created == 3  # its own at-once window: held, not renewed
        await run.cancel()


async def test_an_order_is_an_ari_renewal_only_while_inside_the_window(
    workflow_env: WorkflowEnvironment,
) -> None:
    """The renewal starts in its ARI window (first order ARI_RENEWAL), fails, and
    the next order leaves after the window ended: a plain RENEWAL (Boulder's
    IsWithin at the order: start <= now < end), not exempt from the limits. Red
    before this change: the renewal kept counting as an ARI renewal because it
    started in the window."""
    t0 = await workflow_env.get_current_time()
    window = (t0 + timedelta(days=20), t0 + timedelta(days=20, hours=1))
    row = active_row(t0, timedelta(days=90))
    row.ari_window = window
    policy = FAST_POLICY.model_copy(
        update={"failure_backoff_initial_seconds": 7200, "failure_backoff_max_seconds": 7200}
    )
    fakes = Fakes(workflow_env, row=row, policy=policy)

    async def fail_first(index: int, _: Any) -> Any:
        if index == 0:
            raise app_error(ErrorCode.ACME_INVALID_ORDER, "the order became invalid")
        return DEFAULT

    fakes.behaviours["wait_for_order"] = fail_first
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        await run.sleep_until(window[1])
        first, second = await run.until_calls("place_order", 2, advance=600)
        assert window[0] <= first.at < window[1] and second.at >= window[1]
        assert first.arg.kind is OrderKind.ARI_RENEWAL
        assert second.arg.kind is OrderKind.RENEWAL
        await run.until_active(serial_count=1)
        await run.cancel()
