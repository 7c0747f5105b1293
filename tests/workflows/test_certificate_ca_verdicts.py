"""The workflow believes the CA's verdicts as Let's Encrypt gives them.

A CA refusing on CAA after our check allowed (ACME_CAA) is a failed authorization
at the CA (Boulder's ra.go countFailedValidations): it counts in the budget, our
reading of CAA then is remembered, and no new order goes to that CA until the
reading changes (or ``retry``).

See ``fakes.py`` for the fakes, the in-memory row and how time skipping is used.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, DnsVerdict

from .fakes import DEFAULT, FAST_POLICY, Fakes, app_error, started

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
