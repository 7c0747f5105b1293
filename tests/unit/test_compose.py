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
    assert "TEMPORAL_CONFIG_FILE: /etc/certflow/temporal.toml" in config
    assert "TEMPORAL_PROFILE: default" in config
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


def test_tls_profile_puts_mtls_in_front_of_temporal(tmp_path: Path) -> None:
    """`--profile tls`: HAProxy with client certificates in front of Temporal, its
    PKI made at start, and the worker's profile `tls` going through it with files
    the PKI writes. The HAProxy config is checked by HAProxy itself (``-c``) on a
    PKI written the way the compose service writes it."""
    from temporalio.envconfig import ClientConfigProfile

    from devstack.temporal_tls import write_temporal_pki

    config = _config("tls")
    for service in ("temporal-pki:", "temporal-tls:"):
        assert f"\n  {service}" in config, service
    assert "temporal-pki:/temporal-pki:ro" in config and "published: 7234" in config

    toml = ROOT / "deploy" / "temporal" / "temporal.toml"
    profile = ClientConfigProfile.load("tls", config_source=toml, override_env_vars={})
    assert profile.address == "temporal-tls:7234" and profile.tls is not None
    pki = write_temporal_pki(tmp_path / "temporal-pki")
    written = {p.name for p in pki.directory.iterdir()}
    for source in (profile.tls.server_root_ca_cert, profile.tls.client_cert, profile.tls.client_private_key):
        assert isinstance(source, Path) and source.parent == Path("/temporal-pki") and source.name in written
    assert profile.tls.server_name == "temporal.certflow.test"

    haproxy_cfg = (ROOT / "deploy" / "temporal" / "haproxy-mtls.cfg").read_text()
    assert "verify required" in haproxy_cfg and ":7234" in haproxy_cfg
    local = tmp_path / "haproxy.cfg"
    local.write_text(
        haproxy_cfg.replace("/temporal-pki/", f"{pki.directory}/").replace("temporal:7233", "127.0.0.1:7233")
    )
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    checked = subprocess.run([haproxy, "-c", "-f", str(local)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
