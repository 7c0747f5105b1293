"""What operators see: /metrics with the original's names, JSON log lines without keys."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import asyncpg
import pytest

from temporalio.api.sdk.v1 import WorkflowMetadata

from certflow import cooldown
from certflow.models import LimitScope
from certflow.client import CertflowClient
from tests.e2e.conftest import Deployment

pytestmark = pytest.mark.e2e


def _scrape(deployment: Deployment) -> dict[str, float]:
    url = f"http://{deployment.env['CERTFLOW_METRICS_LISTEN']}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    series: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            # Drop the exporter's own label so tests read like dashboards.
            name = re.sub(r',?service_name="[^"]*"', "", name).replace("{,", "{").replace("{}", "")
            series[name] = float(value)
    return series


def _value(series: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the series of name whose labels include these."""
    total = 0.0
    for key, value in series.items():
        if key.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


async def _issue(deployment: Deployment, client: CertflowClient, label: str) -> str:
    hostname = deployment.hostname(label)
    await client.request([hostname])
    reports = await client.wait([hostname], 60)
    report = reports[hostname]
    assert report is not None and report.status == "ACTIVE"
    return hostname


async def test_metrics_after_issuance_have_the_original_names(
    deployment: Deployment, client: CertflowClient
) -> None:
    await _issue(deployment, client, "metrics")
    await asyncio.sleep(1.5)  # one refresh of the database-driven gauges
    series = _scrape(deployment)
    steps = "certmanager_certificate_provision_steps_total"
    for phase in ("dns_check", "create_order", "poll_order", "issue_cert"):
        assert _value(series, steps, phase=phase, result="ok") >= 1, phase
        count = "certmanager_certificate_provision_step_duration_seconds_count"
        assert _value(series, count, phase=phase) >= 1, phase
    assert _value(series, "certflow_certificates", status="ACTIVE") >= 1
    assert _value(series, "certflow_certificate_soonest_expiry_timestamp_seconds") > time.time()
    # The Temporal SDK's own metrics are on the same endpoint.
    assert any(name.startswith("temporal_") for name in series)


async def test_dns_error_is_counted(deployment: Deployment, client: CertflowClient) -> None:
    before = _value(_scrape(deployment), "certmanager_certificate_provision_steps_total",
                    phase="dns_check", result="dns_error")
    hostname = deployment.bare_hostname("metrics-dns")
    await client.request([hostname])
    await client.wait([hostname], 30)
    after = _value(_scrape(deployment), "certmanager_certificate_provision_steps_total",
                   phase="dns_check", result="dns_error")
    assert after > before


async def test_cooldown_gauge_follows_the_shared_cooldown(
    deployment: Deployment, db: asyncpg.Pool
) -> None:
    directory = deployment.env["CERTFLOW_ACME_DIRECTORY_URL"]
    until = await cooldown.extend_cooldown(
        db, directory, LimitScope.ACCOUNT, "", "NewOrdersPerAccount", 3,
        "urn:ietf:params:acme:error:rateLimited", "test",
    )
    try:
        deadline = time.monotonic() + 10
        while _value(_scrape(deployment), "certmanager_certificate_acme_cooldown") != 1:
            assert time.monotonic() < deadline, "cooldown gauge never went to 1"
            await asyncio.sleep(0.2)
        stamp = _value(_scrape(deployment), "certmanager_certificate_acme_cooldown_until_timestamp_seconds")
        assert abs(stamp - until.timestamp()) < 1
        deadline = time.monotonic() + 15
        while _value(_scrape(deployment), "certmanager_certificate_acme_cooldown") != 0:
            assert time.monotonic() < deadline, "cooldown gauge never went back to 0"
            await asyncio.sleep(0.2)
    finally:
        await cooldown.clear_cooldowns(db)


async def test_worker_logs_are_json_lines_without_key_material(
    deployment: Deployment, client: CertflowClient
) -> None:
    await _issue(deployment, client, "logs")
    failing = deployment.bare_hostname("logs-dns")
    await client.request([failing])  # a logged DNS failure
    deadline = time.monotonic() + 30
    while failing not in deployment.worker.log.read_text():
        assert time.monotonic() < deadline, "the DNS failure was never logged"
        await asyncio.sleep(0.2)
    text = deployment.worker.log.read_text()
    assert "PRIVATE KEY" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    failures = [p for p in parsed if p.get("hostname") == failing]
    assert failures and failures[0]["level"] == "warning"
    assert failures[0]["error_code"] == "DNS_CNAME"
    assert failures[0]["workflow_id"] == f"certificate:{failing}"
    assert "has no CNAME" in failures[0]["error_message"]


async def _visible(client: CertflowClient, query: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        # Each issuance continues as new: count the running execution only.
        running = f'({query}) AND ExecutionStatus="Running"'
        ids = [w.id async for w in client.temporal.list_workflows(running)]
        if ids or time.monotonic() > deadline:
            return ids
        await asyncio.sleep(0.3)


async def test_search_attributes_find_the_right_workflows(
    deployment: Deployment, client: CertflowClient
) -> None:
    issued = deployment.hostname("search-ok")
    broken = deployment.bare_hostname("search-dns")
    await client.request([issued], tenant_id="tenant-search")
    await client.request([broken], tenant_id="tenant-search")
    await client.wait([issued, broken], 60)

    by_host = await _visible(client, f'CertificateHostname="{issued}"')
    assert by_host == [f"certificate:{issued}"]
    assert await _visible(
        client, f'CertificateHostname="{issued}" AND CertificateStatus="ACTIVE"'
    ) == [f"certificate:{issued}"]
    assert await _visible(
        client, f'CertificateHostname="{broken}" AND CertificateErrorCode="DNS_CNAME"'
    ) == [f"certificate:{broken}"]
    assert await _visible(
        client, f'CertificateHostname="{broken}" AND CertificateStatus="PENDING"'
    ) == [f"certificate:{broken}"]
    tenant = set(await _visible(client, 'TenantId="tenant-search"'))
    assert tenant == {f"certificate:{issued}", f"certificate:{broken}"}
    expiring = await _visible(
        client, f'CertificateHostname="{issued}" AND CertificateExpiresAt > "2026-01-01T00:00:00Z"'
    )
    assert expiring == [f"certificate:{issued}"]
    # A query that must not match proves the filters filter.
    assert await _visible(
        client, f'CertificateHostname="{issued}" AND CertificateStatus="FAILED"', timeout=1
    ) == []

    # The workflow shows its state as current details in the UI (nothing secret).
    metadata = await client.handle(broken).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert "PENDING" in metadata.current_details and "DNS_CNAME" in metadata.current_details
    assert "PRIVATE KEY" not in metadata.current_details
