"""docker-compose.yml is valid and wires what docs/operating.md promises (no engine needed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _config(*profiles: str) -> str:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is missing: run scripts/setup.sh (Debian package docker-compose)")
    args = [binary, "-f", str(ROOT / "docker-compose.yml")]
    for profile in profiles:
        args += ["--profile", profile]
    result = subprocess.run(
        [*args, "config"],
        env={"CERTFLOW_ENCRYPTION_KEY": "test", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_compose_file_is_valid() -> None:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is missing: run scripts/setup.sh"
    result = subprocess.run(
        [binary, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        env={"CERTFLOW_ENCRYPTION_KEY": "test", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_services_and_dev_profile() -> None:
    config = _config("dev")
    for service in ("postgres:", "temporal:", "temporal-ui:", "worker:", "pebble:", "challtestsrv:"):
        assert f"\n  {service}" in config, service
    assert "CERTFLOW_DATABASE_URL: postgresql://postgres:postgres@postgres:5432/postgres" in config
    assert "CERTFLOW_TEMPORAL_ADDRESS: temporal:7233" in config
    assert config.count("healthcheck:") >= 3


def test_encryption_key_is_required() -> None:
    binary = shutil.which("docker-compose")
    assert binary
    result = subprocess.run(
        [binary, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "CERTFLOW_ENCRYPTION_KEY" in result.stderr


def test_temporal_dispatches_activities_eagerly() -> None:
    """The compose Temporal server reads the dynamic config that turns on eager
    activity dispatch, as the dev server of the tests and the benchmark does."""
    config = _config()
    mounted = str(ROOT / "temporal-dynamicconfig.yaml")
    assert f"{mounted}:/etc/temporal/config/dynamicconfig/certflow.yaml:ro" in config
    assert "DYNAMIC_CONFIG_FILE_PATH: config/dynamicconfig/certflow.yaml" in config
    text = (ROOT / "temporal-dynamicconfig.yaml").read_text()
    assert "system.enableActivityEagerExecution:\n  - value: true" in text


def test_observability_profile_runs_prometheus_with_the_rules() -> None:
    """`--profile observability` adds Prometheus (no other profile starts it), with
    the rules and a scrape config that reaches the worker's metrics port as the
    job the rules read."""
    config = _config("observability")
    found = re.search(r"\n  prometheus:\n((?:    .*\n)+)", config)
    assert found, config
    service = found.group(1)
    assert "profiles:\n    - observability" in service
    prometheus_dir = ROOT / "deploy" / "prometheus"
    for name in ("prometheus.yml", "certflow-rules.yml"):
        assert f"{prometheus_dir / name}:/etc/prometheus/{name}:ro" in service, name
    assert "--config.file=/etc/prometheus/prometheus.yml" in service
    scrape = (prometheus_dir / "prometheus.yml").read_text()
    assert "job_name: certflow-worker" in scrape and "- certflow-rules.yml" in scrape
    assert 'targets: ["worker:9464"]' in scrape
    assert "CERTFLOW_METRICS_LISTEN: 0.0.0.0:9464" in config
