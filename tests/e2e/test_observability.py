"""What operators see: /metrics with the original's names, JSON log lines without
keys (at DEBUG too), search attributes.

The metrics, gauges and DEBUG-log tests run on a worker of their own
(``observed_stack``: own Pebble, database and task queue): the session deployment
keeps other tests' certificates re-checking DNS in the background, which would raise
the very counters read here. Counters are cumulative, so each test reads them before
and after its own action and asserts the difference.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHistory

from certflow.store import cooldowns
from certflow.product.client import CertflowClient
from certflow.crypto import EncryptionKey
from devstack import servers
from certflow.models import LimitScope
from tests.e2e.conftest import Deployment, worker_log_after_sentinel
from tests.history_events import activities_run
from tests.leaks import key_needles, log_leaks, scan_bytes
from tests.e2e.fault_fixtures import (
    metric_value,
    scrape_metrics,
    ObservedStack,
    observed_client,  # noqa: F401 - fixture
    observed_stack,  # noqa: F401 - fixture
    wait_for,
)

pytestmark = pytest.mark.e2e

STEPS = "certmanager_certificate_provision_steps_total"
STEP_DURATIONS = "certmanager_certificate_provision_step_duration_seconds_count"


async def _issue(deployment: Deployment, client: CertflowClient, label: str) -> str:
    hostname = deployment.hostname(label)
    await client.request([hostname])
    reports = await client.wait([hostname], 60)
    report = reports[hostname]
    assert report is not None and report.status == "ACTIVE"
    return hostname


def _encryption_key(observed: ObservedStack) -> EncryptionKey:
    return EncryptionKey(base64.b64decode(observed.stack.env["CERTFLOW_ENCRYPTION_KEY"]))


async def test_metrics_after_issuance_have_the_original_names(
    observed_stack: ObservedStack, observed_client: CertflowClient
) -> None:
    """Checked: with the "before" read taken after the issuance instead, every step
    delta was 0 and the test failed (the old cumulative ``>= 1`` still passed)."""
    env = observed_stack.stack.env
    phases = ("dns_check", "create_order", "poll_order", "issue_cert")
    before = scrape_metrics(env)
    hostname = observed_stack.stack.hostname("metrics")
    await observed_client.request([hostname])
    await wait_for(observed_client, hostname, lambda r: r.status == "ACTIVE", timeout=60)
    after = scrape_metrics(env)
    deltas = {
        phase: (
            metric_value(after, STEPS, phase=phase, result="ok") - metric_value(before, STEPS, phase=phase, result="ok"),
            metric_value(after, STEP_DURATIONS, phase=phase) - metric_value(before, STEP_DURATIONS, phase=phase),
        )
        for phase in phases
    }
    print(f"\n[metrics] (ok steps, timed steps) added by one issuance: {deltas}")
    for phase, (ok, timed) in deltas.items():
        assert ok >= 1 and timed >= 1, (phase, deltas)
    # The Temporal SDK's own metrics are on the same endpoint.
    assert any(name.startswith("temporal_") for name in after)

    # The database-driven gauges, refreshed every second: wait until they show what the
    # database holds now (this stack's rows only), the new certificate included.
    pool = observed_client.pool
    deadline = time.monotonic() + 30
    while True:
        active = await pool.fetchval("SELECT count(*) FROM certificates WHERE status = 'ACTIVE'")
        soonest = await pool.fetchval(
            "SELECT min(ssl_expires_at) FROM certificates WHERE status IN ('ACTIVE', 'RENEWING')"
        )
        series = scrape_metrics(env)
        shown = metric_value(series, "certflow_certificates", status="ACTIVE")
        stamp = metric_value(series, "certflow_certificate_soonest_expiry_timestamp_seconds")
        # Fresh certificates: none within EXPIRING_SOON_DAYS, but the series is there.
        expiring = [k for k in series if k.startswith("certflow_certificates_expiring_soon{")]
        if (
            active >= 1
            and shown == active
            and abs(stamp - soonest.timestamp()) < 1
            and len(expiring) == 2
            and metric_value(series, "certflow_certificates_expiring_soon") == 0
        ):
            break
        assert time.monotonic() < deadline, (
            f"gauges show {shown} ACTIVE, soonest {stamp}, expiring {expiring}; the database {active}, {soonest}"
        )
        await asyncio.sleep(0.1)


async def test_dns_error_is_counted(
    observed_stack: ObservedStack, observed_client: CertflowClient
) -> None:
    env = observed_stack.stack.env
    before = metric_value(scrape_metrics(env), STEPS, phase="dns_check", result="dns_error")
    hostname = observed_stack.stack.bare_hostname("metrics-dns")
    try:
        await observed_client.request([hostname])
        await wait_for(observed_client, hostname, lambda r: r.error_code == "DNS_CNAME", timeout=30)
        after = metric_value(scrape_metrics(env), STEPS, phase="dns_check", result="dns_error")
        assert after - before >= 1, (before, after)
    finally:
        await observed_client.cancel(hostname)  # no more re-checks counted in later tests


async def test_cooldown_gauge_follows_the_shared_cooldown(
    observed_stack: ObservedStack, observed_client: CertflowClient
) -> None:
    env = observed_stack.stack.env
    db = observed_client.pool
    directory = env["CERTFLOW_ACME_DIRECTORY_URL"]
    # Long enough that no refresh, however late on a loaded machine, can miss it:
    # the gauge follows the cooldown in, then its clearing out.
    until = await cooldowns.extend_cooldown(
        db, directory, LimitScope.ACCOUNT, "", "NewOrdersPerAccount", 600,
        "urn:ietf:params:acme:error:rateLimited", "test",
    )
    def shown() -> tuple[float, float]:
        series = scrape_metrics(env)
        return (
            metric_value(series, "certmanager_certificate_acme_cooldown"),
            # What the account-wide cooldown alert reads (deploy/prometheus/).
            metric_value(series, "certflow_acme_cooldowns", scope="account"),
        )

    try:
        deadline = time.monotonic() + 60
        while shown() != (1, 1):
            assert time.monotonic() < deadline, f"cooldown gauges never went to 1: {shown()}"
            await asyncio.sleep(0.2)
        stamp = metric_value(scrape_metrics(env), "certmanager_certificate_acme_cooldown_until_timestamp_seconds")
        assert abs(stamp - until.timestamp()) < 1
    finally:
        await cooldowns.clear_cooldowns(db)
    deadline = time.monotonic() + 60
    while shown() != (0, 0):
        assert time.monotonic() < deadline, f"cooldown gauges never went back to 0: {shown()}"
        await asyncio.sleep(0.2)


async def test_a_worker_at_debug_writes_no_key_material_to_its_log(
    observed_stack: ObservedStack, observed_client: CertflowClient
) -> None:
    """The worker at ``CERTFLOW_LOG_LEVEL=DEBUG`` issues a certificate: its log holds
    no part of the certificate's key nor of the ACME account key, in any encoding
    searched, and no ``PRIVATE KEY`` text. The acme library logs whole JWS payloads
    and responses at DEBUG; certflow/running/logs.py caps its logger at INFO.

    Checked: with that cap removed from certflow/running/logs.py the test failed, on the last
    assertion (47 acme DEBUG lines: requests, JWS payloads, responses, nonces); restored.
    The key-material search itself still passed uncapped: no private key travels
    through what acme logs (finalize sends a CSR, new-account the public JWK), so the
    search alone could not catch the cap's removal, hence the check on the dumps."""
    stack = observed_stack.stack
    hostname = stack.hostname("debug-log")
    await observed_client.request([hostname])
    await wait_for(observed_client, hostname, lambda r: r.status == "ACTIVE", timeout=60)
    log = await worker_log_after_sentinel(stack.worker, 0)

    entries = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert any(e.get("level") == "debug" for e in entries), "the worker is not logging at DEBUG"
    assert any(e.get("hostname") == hostname for e in entries), "the issuance left no log line"

    key = _encryption_key(observed_stack)
    row = await observed_client.pool.fetchrow(
        "SELECT encrypted_ssl_private_key FROM certificates WHERE hostname = $1", hostname
    )
    assert row is not None and row["encrypted_ssl_private_key"] is not None
    keys = [key.decrypt(bytes(row["encrypted_ssl_private_key"]))]
    accounts = await observed_client.pool.fetch("SELECT encrypted_account_key FROM acme_accounts")
    assert accounts
    keys += [key.decrypt(bytes(account["encrypted_account_key"])) for account in accounts]
    # The one detector (tests/leaks.py): these keys in every encoding it knows, and
    # any private key by its structure.
    findings = log_leaks(log, key_needles(*keys))
    assert not findings, "\n".join(findings[:10])
    # Where a key would travel if ever one did: the acme library's wire dumps.
    dumps = [e for e in entries if str(e.get("logger", "")).startswith("acme") and e.get("level") == "debug"]
    assert not dumps, f"{len(dumps)} acme DEBUG lines, e.g. {str(dumps[0])[:300]}"
    print(f"\n[DEBUG log] {len(entries)} lines, {sum(e.get('level') == 'debug' for e in entries)} at debug; "
          f"leak search: {findings.summary()}")


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
    findings = log_leaks(text, key_needles(*servers.captured_keys(deployment.key_capture)))
    assert not findings, "\n".join(findings[:10])
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    failures = [p for p in parsed if p.get("hostname") == failing]
    assert failures and failures[0]["level"] == "warning"
    assert failures[0]["error_code"] == "DNS_CNAME"
    assert failures[0]["workflow_id"] == f"certificate:{failing}"
    assert "has no CNAME" in failures[0]["error_message"]


async def _visible(
    client: CertflowClient, query: str, expected: set[str], timeout: float = 30
) -> set[str]:
    """The running workflows the query finds, once that is ``expected`` (visibility
    indexes asynchronously), else the last answer when the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        # Each issuance continues as new: count the running execution only.
        running = f'({query}) AND ExecutionStatus="Running"'
        ids = {w.id async for w in client.temporal.list_workflows(running)}
        if ids == expected or time.monotonic() > deadline:
            return ids
        await asyncio.sleep(0.3)


async def test_search_attributes_find_the_right_workflows(
    deployment: Deployment, client: CertflowClient
) -> None:
    issued = deployment.hostname("search-ok")
    broken = deployment.bare_hostname("search-dns")
    tenant = f"tenant-search-{uuid.uuid4().hex[:8]}"  # this test's own
    await client.request([issued], tenant_id=tenant)
    await client.request([broken], tenant_id=tenant)
    await client.wait([issued, broken], 60)

    issued_id, broken_id = f"certificate:{issued}", f"certificate:{broken}"
    expectations = {
        f'CertificateHostname="{issued}"': {issued_id},
        f'CertificateHostname="{issued}" AND CertificateStatus="ACTIVE"': {issued_id},
        # The run waiting for the renewal shows them: the run that issued (kept), or
        # the run it continued as new into (continue-as-new carried them).
        f'CertificateHostname="{issued}" AND CertificateStatus="ACTIVE"'
        ' AND ExecutionStatus="Running"': {issued_id},
        f'CertificateHostname="{broken}" AND CertificateErrorCode="DNS_CNAME"': {broken_id},
        f'CertificateHostname="{broken}" AND CertificateStatus="PENDING"': {broken_id},
        f'TenantId="{tenant}"': {issued_id, broken_id},
        f'CertificateHostname="{issued}" AND CertificateExpiresAt > "2026-01-01T00:00:00Z"': {issued_id},
    }
    for query, expected in expectations.items():
        assert await _visible(client, query, expected) == expected, query
    # A query that must not match proves the filters filter. The index already shows
    # this workflow as ACTIVE (above), so one answer is enough.
    ids = {
        w.id
        async for w in client.temporal.list_workflows(
            f'CertificateHostname="{issued}" AND CertificateStatus="FAILED"'
        )
    }
    assert ids == set(), ids

    # The workflow shows its state as current details in the UI (nothing secret).
    metadata = await client.handle(broken).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert "PENDING" in metadata.current_details and "DNS_CNAME" in metadata.current_details
    assert not scan_bytes(metadata.current_details, key_needles(*servers.captured_keys(deployment.key_capture)))


async def test_an_issuance_repeats_no_search_attribute_and_records_no_patch(
    deployment: Deployment, client: CertflowClient
) -> None:
    """The run that issues a requested hostname (the design certflow starts, on the
    real servers): the start's search attributes count as shown, so its one upsert
    is the certificate ACTIVE; the design comes with the start, so no patch marker;
    the order placed and validated in one activity, and the order ready at once
    finalized with the attributes unchanged; the renewal in the same run
    (RUN_KEPT_AFTER_ISSUANCE_DESIGN), one upsert more. Shown red: with
    ``_shown_at_start`` returning None the upserts were PENDING, ACTIVE; with
    ``_publish`` ignoring ``attributes_held``, PROVISIONING, ACTIVE; with
    ``_begin_renewal`` not holding them, the renewal's RENEWING, ACTIVE; with the
    run not kept, the renewal was in a run of its own. A client starting without a
    design adds a ``core_patch`` marker and its ``TemporalChangeVersion`` upsert."""
    hostname = deployment.hostname("one-upsert")
    tenant = f"tenant-upsert-{uuid.uuid4().hex[:8]}"
    await client.request([hostname], tenant_id=tenant)
    issued = (await client.wait([hostname], 60))[hostname]
    assert issued is not None and issued.status == "ACTIVE"
    handle = client.handle(hostname)
    first = (await handle.describe()).run_id
    assert first is not None

    history = await handle.fetch_history()
    assert _statuses_upserted(history) == ["ACTIVE"]
    markers = [
        e.marker_recorded_event_attributes.marker_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    assert markers and "core_patch" not in markers  # the local activities' only
    assert _activities(history) == ["order_and_validate", "finalize_and_store"]

    # A renewal the CA grants at once shows ACTIVE next, never RENEWING; the run
    # that issued renews.
    await client.renew(hostname)
    deadline = time.monotonic() + 60
    while (renewed := await client.status(hostname)) is None or renewed.serial == issued.serial:
        assert time.monotonic() < deadline, "the renewal never finished"
        await asyncio.sleep(0.2)
    history = await handle.fetch_history()
    assert (await handle.describe()).run_id == first
    assert "begin_renewal" in activities_run(history)
    # ACTIVE again when the new certificate's expiry differs (Pebble's are to the
    # second: one renewed within the second shows the same).
    assert set(_statuses_upserted(history)) == {"ACTIVE"}
    assert _activities(history) == ["order_and_validate", "finalize_and_store"] * 2


def _statuses_upserted(history: WorkflowHistory) -> list[str]:
    return [
        json.loads(
            e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields[
                "CertificateStatus"
            ].data
        )
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]


def _activities(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
