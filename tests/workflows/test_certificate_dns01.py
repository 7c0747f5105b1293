"""The Certificate workflow over delegated dns-01 and dns-persist-01, on the
time-skipping test server: the TXT published before the CA is asked (and never the
HTTP-01 self-check), withdrawn once the order is valid or abandoned, kept with its
order while it is not on every server yet; dns-persist-01 writes nothing."""

from __future__ import annotations

from typing import Any

from temporalio.testing import WorkflowEnvironment

from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, Phase, ValidationMethod
from certflow.activity_payloads import DnsVerdict

from .fakes import (
    AFTER_ISSUANCE_STEPS,
    Fakes,
    app_error,
    fail_first,
    invalid_order_error,
    order,
    started,
)

DNS01_STEPS = [
    "ensure_certificate",
    "check_dns",
    "place_order",
    "publish_dns01",  # the TXT on every server of our zone, before the CA is asked
    "wait_for_order",  # accepts the challenge first, then polls
    "finalize_and_store",
    "withdraw_dns01",  # the order is valid: its TXT goes
]


def verdict(*methods: ValidationMethod) -> Any:
    async def behaviour(index: int, _: Any) -> Any:
        return DnsVerdict(allowed_issuers=[], methods=list(methods), method_reason=f"{methods[0]} ready")

    return behaviour


async def test_dns01_publishes_before_the_ca_is_asked_and_withdraws_after(
    workflow_env: WorkflowEnvironment,
) -> None:
    """Shown red: with the withdraw after finalize removed from workflows/obtain.py,
    the steps end at finalize_and_store and the fake zone keeps the TXT."""
    fakes = Fakes(workflow_env, behaviours={"check_dns": verdict(ValidationMethod.DNS_01)})
    async with started(workflow_env, fakes) as run:
        await run.until(lambda s: s.status is CertificateStatus.ACTIVE, "ACTIVE")
        await run.until_calls("withdraw_dns01", 1)
        assert fakes.names() == DNS01_STEPS + AFTER_ISSUANCE_STEPS
        (placed,) = fakes.of("place_order")
        assert placed.arg.methods == [ValidationMethod.DNS_01]
        assert fakes.row.dns01_txt is None
        await run.cancel()


async def test_a_txt_not_on_every_server_keeps_its_order_and_is_published_again(
    workflow_env: WorkflowEnvironment,
) -> None:
    """DNS01_NOT_VISIBLE: PENDING, budget untouched, the order kept (the CA was never
    asked), re-checked on the DNS backoff; the next attempt publishes the same
    order's TXT again and accepts it — no second order."""
    not_visible = lambda: app_error(ErrorCode.DNS01_NOT_VISIBLE, "not on 127.0.2.2 yet")  # noqa: E731
    fakes = Fakes(
        workflow_env,
        behaviours={
            "check_dns": verdict(ValidationMethod.DNS_01),
            "publish_dns01": fail_first(1, not_visible),
        },
    )
    async with started(workflow_env, fakes) as run:
        waiting = await run.until(lambda s: s.phase == Phase.WAITING_FOR_DNS01, "the dns-01 wait")
        assert waiting.status is CertificateStatus.PENDING and waiting.retry_count == 0
        assert "wait_for_order" not in fakes.names()
        (outcome,) = fakes.outcomes()
        assert outcome.keep_order
        await run.until_active(advance=30)
        assert len(fakes.of("place_order")) == 1 and len(fakes.of("publish_dns01")) == 2
        (accepting,) = fakes.of("wait_for_order")
        assert accepting.arg.accept_first and accepting.arg.order_url == order(1).order_url
        await run.cancel()


async def test_an_abandoned_order_withdraws_its_txt(workflow_env: WorkflowEnvironment) -> None:
    """An order the CA invalidated is dropped, and its TXT with it; so is the TXT of an
    open order when the certificate is canceled."""
    fakes = Fakes(
        workflow_env,
        behaviours={
            "check_dns": verdict(ValidationMethod.DNS_01),
            "wait_for_order": fail_first(1, invalid_order_error),
        },
    )
    async with started(workflow_env, fakes) as run:
        await run.until_active(advance=30)
        names = fakes.names()
        first_failure = names.index("record_failure")
        assert names[first_failure + 1] == "withdraw_dns01"
        await run.cancel()

    held = Fakes(
        workflow_env,
        behaviours={
            "check_dns": verdict(ValidationMethod.DNS_01),
            "publish_dns01": fail_first(10, lambda: app_error(ErrorCode.DNS01_NOT_VISIBLE, "lagging")),
        },
    )
    async with started(workflow_env, held) as run:
        await run.until(lambda s: s.phase == Phase.WAITING_FOR_DNS01, "the dns-01 wait")
        await run.cancel()
        assert held.names()[-3:] == ["cancel_certificate", "withdraw_dns01", "deactivate_authorizations"]


async def test_dns_persist_writes_nothing_and_needs_no_self_check(
    workflow_env: WorkflowEnvironment,
) -> None:
    fakes = Fakes(workflow_env, behaviours={"check_dns": verdict(ValidationMethod.DNS_PERSIST_01)})
    async with started(workflow_env, fakes) as run:
        await run.until_active()
        assert fakes.names() == [
            "ensure_certificate", "check_dns", "place_order", "wait_for_order", "finalize_and_store"
        ] + AFTER_ISSUANCE_STEPS
        assert fakes.row.dns01_txt is None
        await run.cancel()
