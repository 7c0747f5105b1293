"""Traces. Step spans with the original's attributes, recorded by an in-memory
exporter while the real activities run in this process against Pebble and
challtestsrv; and the worker process as it configures tracing itself
(``CERTFLOW_OTLP_ENDPOINT``: certflow.running.tracing's OTLP/HTTP exporter plus Temporal's
``TracingInterceptor``), its spans received by a collector stand-in on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from certflow.acme.account import AcmeClients, ensure_account
from activities.acme import AcmeActivities
from certflow.acme.router import IssuerRouter
from certflow.hostnames import Hostname
from certflow.metrics import CertflowMetrics
from activities.dns import DnsActivities
from certflow.dns.checks import DnsChecker
from certflow.store import certificates
from certflow.activity_payloads import (
    AcceptChallengeInput,
    CheckDnsInput,
    CreateOrderInput,
    FinalizeInput,
    WaitForOrderInput,
)
from certflow.crypto import KeyType
from certflow.product.client import CertflowClient
from tests.e2e.conftest import CNAME_TARGET, Deployment, reconcile_schedule_paused
from tests.e2e.fault_fixtures import (
    ObservedStack,
    OtlpReceiver,
    ReceivedSpan,
    observed_client,  # noqa: F401 - fixture
    observed_stack,  # noqa: F401 - fixture
    wait_for,
)

pytestmark = pytest.mark.e2e

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracer_provider() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


def _spans(name: str) -> list[dict[str, object]]:
    spans: list[dict[str, object]] = []
    for span in EXPORTER.get_finished_spans():
        if span.name == name:
            spans.append({**(span.attributes or {}), "_status": span.status.status_code.name})
    return spans


@pytest.fixture
async def held_reconcile(client: CertflowClient) -> AsyncIterator[None]:
    """The test below plants a row with no workflow in the shared deployment's database:
    its reconcile schedule is held until the row is gone."""
    async with reconcile_schedule_paused(client, "tests/e2e/test_tracing.py"):
        yield


async def test_step_spans_carry_hostname_certificate_and_error_data(
    deployment: Deployment, db: asyncpg.Pool, held_reconcile: None
) -> None:
    env = ActivityEnvironment()
    dns = DnsActivities(DnsChecker(deployment.pebble.dns_resolver, CNAME_TARGET, "letsencrypt.org"))
    broken = deployment.bare_hostname("traced-dns")
    with pytest.raises(ApplicationError):
        await env.run(dns.check_dns, CheckDnsInput(hostname=broken))
    failed = [s for s in _spans("certmanager.dns_check") if s["certificate.hostname"] == broken]
    assert failed and failed[0]["provisioning.error_code"] == "DNS_CNAME"
    assert failed[0]["_status"] == "ERROR"

    hostname = deployment.hostname("traced")
    await env.run(dns.check_dns, CheckDnsInput(hostname=hostname))
    ok = [s for s in _spans("certmanager.dns_check") if s["certificate.hostname"] == hostname]
    assert ok and ok[0]["_status"] == "UNSET" and "provisioning.error_code" not in ok[0]

    issuer = deployment.pebble.issuer()
    account = await ensure_account(db, issuer, None, deployment.encryption_key)
    metrics = CertflowMetrics()
    issuers = IssuerRouter(
        AcmeClients(account, issuer), db, deployment.encryption_key, KeyType.EC256,
        ThreadPoolExecutor(max_workers=2), metrics,
    )
    acme = AcmeActivities(issuers, db, metrics)
    record = await certificates.ensure_certificate(db, hostname, None, None)
    try:
        await _issue_in_process(env, acme, db, record.certificate_id, hostname)
    finally:
        await certificates.delete(db, record.certificate_id)
    created = [s for s in _spans("certmanager.create_order") if s.get("certificate.hostname") == hostname]
    assert created and created[0]["_status"] == "UNSET"
    issued = [s for s in _spans("certmanager.issue_cert") if s.get("certificate.id") == record.certificate_id]
    assert issued and issued[0]["certificate.hostname"] == hostname


async def _issue_in_process(
    env: ActivityEnvironment,
    acme: AcmeActivities,
    db: asyncpg.Pool,
    certificate_id: str,
    hostname: Hostname,
) -> None:
    order = await env.run(acme.create_order, CreateOrderInput(hostname=hostname))
    await certificates.persist_challenge(db, certificate_id, order)
    await env.run(acme.accept_challenge, AcceptChallengeInput(challenge_url=order.challenge_url))
    await env.run(
        acme.wait_for_order,
        WaitForOrderInput(order_url=order.order_url, challenge_url=order.challenge_url, within_seconds=20),
    )
    await env.run(
        acme.finalize_and_store,
        FinalizeInput(certificate_id=certificate_id, hostname=hostname, order_url=order.order_url),
    )
    polled = [s for s in _spans("certmanager.poll_order") if s.get("acme.order_url") == order.order_url]
    assert polled


# ------------------------------------------------------------- the worker's own tracing

ACTIVITIES = ("check_dns", "order_and_validate", "finalize_and_store")
STEPS = ("certmanager.dns_check", "certmanager.create_order", "certmanager.issue_cert")
SPANS_DEADLINE_S = 60.0  # the worker's BatchSpanProcessor exports every few seconds


@pytest.fixture(scope="module")
async def otlp_issued(observed_stack: ObservedStack, observed_client: CertflowClient) -> str:
    """One certificate issued by the worker that exports its traces: its hostname."""
    hostname = observed_stack.stack.hostname("otlp")
    await observed_client.request([hostname])
    await wait_for(observed_client, hostname, lambda r: r.status == "ACTIVE", timeout=120)
    return hostname


@dataclass
class IssuanceSpans:
    workflow: list[ReceivedSpan]
    scheduled: dict[str, list[ReceivedSpan]]
    """``StartActivity:*`` spans, which the workflow side creates."""
    activities: dict[str, list[ReceivedSpan]]
    steps: dict[str, list[ReceivedSpan]]
    received: list[ReceivedSpan]


def _issuance_spans(otlp: OtlpReceiver, hostname: str) -> IssuanceSpans:
    workflow_id = f"certificate:{hostname}"
    spans = otlp.spans()
    found = IssuanceSpans([], {}, {}, {}, spans)
    for span in spans:
        ours = span.attributes.get("temporalWorkflowID") == workflow_id
        if span.name == "RunWorkflow:Certificate" and ours:
            found.workflow.append(span)
        elif span.name.startswith("StartActivity:") and ours:
            found.scheduled.setdefault(span.name.removeprefix("StartActivity:"), []).append(span)
        elif span.name.startswith("RunActivity:") and ours:
            found.activities.setdefault(span.name.removeprefix("RunActivity:"), []).append(span)
        elif span.name.startswith("certmanager.") and span.attributes.get("certificate.hostname") == hostname:
            found.steps.setdefault(span.name, []).append(span)
    return found


async def _spans_until(
    otlp: OtlpReceiver, hostname: str, done: Callable[[IssuanceSpans], bool]
) -> IssuanceSpans:
    deadline = time.monotonic() + SPANS_DEADLINE_S
    while True:
        found = _issuance_spans(otlp, hostname)
        if done(found):
            return found
        assert time.monotonic() < deadline, (
            f"spans of certificate:{hostname} after {SPANS_DEADLINE_S:.0f} s: workflow "
            f"{len(found.workflow)}, scheduled {sorted(found.scheduled)}, activities "
            f"{sorted(found.activities)}, steps "
            f"{sorted(found.steps)}; all received: "
            f"{sorted({(s.name, str(s.attributes.get('temporalWorkflowID'))) for s in found.received})}"
        )
        await asyncio.sleep(0.2)


async def test_the_worker_exports_activity_and_step_spans_over_otlp(
    observed_stack: ObservedStack, otlp_issued: str
) -> None:
    """One issuance on a worker configured with ``CERTFLOW_OTLP_ENDPOINT``: the
    interceptor's activity spans (``RunActivity:*``, with the workflow id) and the step
    spans reach the collector over OTLP/HTTP, the step spans with
    ``certificate.hostname`` and as children of their activity's span.

    Checked: with ``TracingInterceptor()`` not added in worker.py ``build``, no
    activity span arrived and the test failed at its deadline; reverted."""
    hostname = otlp_issued
    found = await _spans_until(
        observed_stack.otlp,
        hostname,
        lambda f: set(ACTIVITIES) <= f.activities.keys() and set(STEPS) <= f.steps.keys(),
    )
    assert {s.service for s in found.received} == {"certflow-worker"}
    activity_span_ids = {s.span_id for spans in found.activities.values() for s in spans}
    for name in STEPS:
        orphans = [s for s in found.steps[name] if s.parent_span_id not in activity_span_ids]
        assert not orphans, f"{name} not inside an activity span of {hostname}: {orphans}"
    print(
        f"\n[otlp] {len(found.received)} spans received; activities {sorted(found.activities)}, "
        f"steps {sorted(found.steps)}, workflow spans {len(found.workflow)}"
    )


async def test_the_worker_exports_the_workflow_span_of_an_issuance(
    observed_stack: ObservedStack, otlp_issued: str
) -> None:
    """docs/operating.md: "the Temporal tracing interceptor's workflow and activity spans". The
    issuance's ``RunWorkflow:Certificate`` span arrives, and each activity's run span
    is the child of the ``StartActivity`` span the workflow side made for it.

    Checked: without ``always_create_workflow_spans=True`` in worker.py no
    workflow-side span arrives (no certflow client traces, so the interceptor had
    no parent span to create them under) and this fails; with it, it passes."""
    hostname = otlp_issued
    # The workflow span is queued for export before any of its activities' spans (it
    # starts the run), so once those are all in, it is in too, or never comes.
    found = await _spans_until(
        observed_stack.otlp, hostname, lambda f: set(ACTIVITIES) <= f.activities.keys()
    )
    assert found.workflow, f"no RunWorkflow:Certificate span for {hostname}"
    for name in ACTIVITIES:
        scheduled = {s.span_id for s in found.scheduled.get(name, [])}
        orphans = [s for s in found.activities[name] if s.parent_span_id not in scheduled]
        assert not orphans, f"RunActivity:{name} not under a StartActivity:{name} span: {orphans}"
