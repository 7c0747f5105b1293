"""Step spans with the original's attributes, recorded by an in-memory exporter
while the real activities run against Pebble and challtestsrv."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.acme_client import AcmeClients, ensure_account
from activities.acme_orders import AcmeActivities
from activities.dns_checks import DnsActivities, DnsChecker
from certflow import certificates
from certflow.models import (
    AcceptChallengeInput,
    CheckDnsInput,
    CreateOrderInput,
    FinalizeInput,
    WaitForOrderInput,
)
from certflow.settings import KeyType
from tests.e2e.conftest import CNAME_TARGET, Deployment

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


async def test_step_spans_carry_hostname_certificate_and_error_data(
    deployment: Deployment, db: asyncpg.Pool
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

    account = await ensure_account(
        db, deployment.pebble.directory_url, None, deployment.encryption_key,
        str(deployment.pebble.ca_bundle),
    )
    acme = AcmeActivities(
        AcmeClients(account), db, deployment.encryption_key, KeyType.EC256,
        ThreadPoolExecutor(max_workers=2),
    )
    record = await certificates.ensure_certificate(db, hostname, None, None)
    order = await env.run(acme.create_order, CreateOrderInput(hostname=hostname))
    await certificates.persist_challenge(db, record.certificate_id, order)
    await env.run(acme.accept_challenge, AcceptChallengeInput(challenge_url=order.challenge_url))
    await env.run(
        acme.wait_for_order,
        WaitForOrderInput(order_url=order.order_url, challenge_url=order.challenge_url, within_seconds=20),
    )
    await env.run(
        acme.finalize_and_store,
        FinalizeInput(certificate_id=record.certificate_id, hostname=hostname, order_url=order.order_url),
    )
    created = [s for s in _spans("certmanager.create_order") if s.get("certificate.hostname") == hostname]
    assert created and created[0]["_status"] == "UNSET"
    polled = [s for s in _spans("certmanager.poll_order") if s.get("acme.order_url") == order.order_url]
    assert polled
    issued = [s for s in _spans("certmanager.issue_cert") if s.get("certificate.id") == record.certificate_id]
    assert issued and issued[0]["certificate.hostname"] == hostname
