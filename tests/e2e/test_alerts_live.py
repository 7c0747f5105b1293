"""Alerts on real parts (issue 26): a real worker issues a real certificate
through Pebble, a real Prometheus scrapes the worker's /metrics every second and
evaluates the shipped rules, and its API shows the expiring-certificate alert
firing; a run of a retired design on the same worker fires the workflow-task one.

The worker runs with ``CERTFLOW_EXPIRING_SOON_DAYS`` beyond the lifetime of any
certificate Pebble issues, so the certificate it has just issued — ACTIVE, no
renewal in progress — is one that expires within the window, without waiting
years or planting rows. The rule is the shipped one, expression untouched; only
its ``for:`` hold is 0s in the test's copy (the hold is promtool-tested in
tests/prometheus/certflow-rules.test.yml).

Checked: with the rule's expression reading ``certflow_certificate_expiring_soon``
(a name the worker does not export) this failed: the alert never fired within
its 60 s; restored.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from devstack import servers
from devstack.prometheus import PrometheusServer, scrape_config, start_prometheus
from temporalio.client import WorkflowHandle

from certflow.contract import CERTIFICATE_WORKFLOW, workflow_id_for
from certflow.hostnames import as_hostname
from certflow.workflow_payloads import CertificateInput
from tests.e2e.fault_fixtures import Stack, build_stack, connect_client, wait_for
from workflows.patches import FEWER_ROUND_TRIPS_DESIGN

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "certflow-rules.yml"
ALERT = "CertflowCertificateExpiringWithoutRenewal"
T = TypeVar("T")


def without_hold(rules: str, alert: str) -> str:
    """The rules with ``alert``'s ``for:`` set to 0s, everything else as shipped."""
    head, marker, tail = rules.partition(f"- alert: {alert}\n")
    assert marker, f"no {alert} in the rules"
    tail, count = re.subn(r"^(\s+)for: \S+$", r"\1for: 0s", tail, count=1, flags=re.M)
    assert count == 1, f"{alert} has no for:"
    return head + marker + tail


@pytest.fixture(scope="module")
def alert_stack(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    stack = build_stack(
        tmp_path_factory.mktemp("alerts"),
        temporal,
        new_database("certflow_alerts"),
        with_proxy=False,
        extra={"CERTFLOW_EXPIRING_SOON_DAYS": "36500"},
    )
    try:
        yield stack
    finally:
        stack.stop()


async def _until(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` (in a thread: it calls Prometheus) until it returns a value."""
    deadline = time.monotonic() + timeout
    while True:
        found = await asyncio.to_thread(probe)
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{what}: not seen in {timeout:g}s"
        await asyncio.sleep(0.2)


def _value(prometheus: PrometheusServer, query: str) -> float | None:
    result = prometheus.api("query", query=query)["result"]
    return float(result[0]["value"][1]) if result else None


def _firing(prometheus: PrometheusServer) -> dict[str, Any] | None:
    for alert in prometheus.alerts():
        if alert["labels"]["alertname"] == ALERT and alert["state"] == "firing":
            return alert
    return None


async def test_an_expiring_certificate_fires_its_alert(alert_stack: Stack, tmp_path: Path) -> None:
    rules = tmp_path / "certflow-rules.yml"
    rules.write_text(without_hold(RULES.read_text(), ALERT))
    target = alert_stack.env["CERTFLOW_METRICS_LISTEN"]
    prometheus = start_prometheus(tmp_path / "prometheus", scrape_config(rules, [target]))
    try:
        # Scraped, nothing expiring yet: the alert is not there.
        query = 'max(certflow_certificates_expiring_soon{job="certflow-worker",status="ACTIVE"})'
        assert await _until(lambda: _value(prometheus, query), 60, "the gauge scraped") == 0
        assert not [a for a in prometheus.alerts() if a["labels"]["alertname"] == ALERT]

        client = await connect_client(alert_stack)
        try:
            hostname = alert_stack.hostname("expiring")
            await client.request([hostname])
            await wait_for(client, hostname, lambda r: r.status == "ACTIVE", timeout=60)
        finally:
            await client.close()

        alert = await _until(lambda: _firing(prometheus), 60, f"{ALERT} firing")
        assert alert["labels"]["job"] == "certflow-worker" and alert["labels"]["severity"] == "page"
        assert alert["annotations"]["runbook"] == f"docs/operating.md#{ALERT.lower()}"
        assert float(alert["value"]) >= 1
        # The other series the rules read that this worker has exported by now are
        # scraped under the names the rules use.
        for series in (
            "up",
            "certflow_certificates",
            "certflow_acme_cooldowns",
            "certflow_http01_self_check_total",
            "temporal_workflow_task_queue_poll_succeed",
        ):
            assert _value(prometheus, f'max({series}{{job="certflow-worker"}})') is not None, series
    except BaseException:
        print(prometheus.log.read_text(errors="replace")[-3000:])
        raise
    finally:
        prometheus.stop()


async def test_a_run_of_a_retired_design_fires_the_workflow_task_alert(alert_stack: Stack, tmp_path: Path) -> None:
    """A Certificate run of design 2 (retired: a client of an old release started
    it) fails its workflow task on this worker with RetiredDesign, and the
    SDK's failure counter, scraped under the name the rule reads, fires
    CertflowWorkflowTaskFailing for its workflow type and task queue.

    Checked: with the rule reading ``temporal_workflow_task_failed`` (not a name
    the SDK exports) the alert never fired within its 60 s; restored."""
    alert = "CertflowWorkflowTaskFailing"
    rules = tmp_path / "certflow-rules.yml"
    rules.write_text(without_hold(RULES.read_text(), alert))
    target = alert_stack.env["CERTFLOW_METRICS_LISTEN"]
    prometheus = start_prometheus(tmp_path / "prometheus", scrape_config(rules, [target]))
    client = await connect_client(alert_stack)
    hostname = alert_stack.hostname("retired")
    handle: WorkflowHandle[Any, Any] = await client.temporal.start_workflow(
        CERTIFICATE_WORKFLOW,
        CertificateInput(hostname=as_hostname(hostname), design=FEWER_ROUND_TRIPS_DESIGN),
        id=workflow_id_for(hostname),
        task_queue=alert_stack.task_queue,
    )
    try:

        def firing() -> dict[str, Any] | None:
            for found in prometheus.alerts():
                labels = found["labels"]
                if labels["alertname"] == alert and found["state"] == "firing":
                    return found if labels.get("workflow_type") == "Certificate" else None
            return None

        fired = await _until(firing, 60, f"{alert} firing")
        assert fired["labels"]["task_queue"] == alert_stack.task_queue
        assert fired["labels"]["severity"] == "page"
        assert fired["annotations"]["runbook"] == f"docs/operating.md#{alert.lower()}"
    except BaseException:
        print(prometheus.log.read_text(errors="replace")[-3000:])
        raise
    finally:
        await handle.terminate("test over")
        await client.close()
        prometheus.stop()
