"""The alert rules on real Prometheus tooling: ``promtool check rules`` and
``promtool test rules`` (a case per alert, tests/prometheus/), the scrape config
valid, and every alert's runbook a section of docs/operating.md.

Checked: with CertflowCertificateExpiringWithoutRenewal reading ``status="RENEWING"``
the promtool unit tests failed (no alert at 17m); restored."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "certflow-rules.yml"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "certflow-rules.test.yml"
RUNBOOKS = ROOT / "docs" / "operating.md"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing: run scripts/setup.sh (Debian package prometheus)")
    return subprocess.run(
        [binary, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def alerts() -> dict[str, str]:
    """Each alert's name and its runbook annotation, read from the rules file."""
    text = RULES.read_text()
    names = re.findall(r"^\s+- alert: (\w+)$", text, re.M)
    blocks = re.split(r"^\s+- alert: ", text, flags=re.M)[1:]
    runbooks = [re.search(r"^\s+runbook: (\S+)$", block, re.M) for block in blocks]
    return {name: found.group(1) if found else "" for name, found in zip(names, runbooks)}


def test_the_rules_are_valid() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_the_scrape_config_is_valid() -> None:
    result = _promtool("check", "config", str(SCRAPE_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_passes_its_unit_tests() -> None:
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_each_alert_has_a_firing_case_and_a_runbook_section() -> None:
    found = alerts()
    assert len(found) >= 7, found
    cases = RULE_TESTS.read_text()
    headings = set(re.findall(r"^### (\w+)$", RUNBOOKS.read_text(), re.M))
    for name, runbook in found.items():
        firing = rf"alertname: {name}\n\s+exp_alerts:\n\s+- exp_labels:"
        assert re.search(firing, cases), f"{name}: no promtool case where it fires"
        assert runbook == f"docs/operating.md#{name.lower()}", (name, runbook)
        assert name in headings, f"{name}: no '### {name}' section in docs/operating.md"
