"""Settings: every bad value stops start-up with one line naming the variable."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from certflow.errors import ConfigError
from certflow.connect.settings import ClientSettings, load_settings
from certflow.connect.temporal_config import load_temporal_connection
from certflow.crypto import KeyType
from certflow.running.worker_settings import Settings

GOOD = {
    "CERTFLOW_DATABASE_URL": "postgresql://postgres@127.0.0.1/certflow",
    "CERTFLOW_ACME_DIRECTORY_URL": "https://acme.test/dir",
    "CERTFLOW_ENCRYPTION_KEY": base64.b64encode(bytes(32)).decode(),
    "CERTFLOW_CNAME_TARGET": "Edge.SaaS.test.",
    "CERTFLOW_DNS_RESOLVER": "127.0.0.1:53",
}


@pytest.fixture
def env(clean_environment: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name, value in GOOD.items():
        clean_environment.setenv(name, value)
    return clean_environment


def test_defaults_and_normalization(env: pytest.MonkeyPatch) -> None:
    settings = load_settings(Settings)
    temporal = load_temporal_connection(settings)
    assert (temporal.address, temporal.namespace, temporal.tls) == ("localhost:7233", "default", None)
    assert settings.task_queue == "certflow"
    assert settings.acme_key_type is KeyType.EC256
    assert settings.caa_issuer_domain == "letsencrypt.org"
    assert settings.cname_target == "edge.saas.test"
    assert settings.encryption_key_bytes == bytes(32)
    assert settings.dns_resolver_address == ("127.0.0.1", 53)
    assert settings.http01_address == ("0.0.0.0", 80)
    assert "AAAA" not in repr(settings)  # the key is a secret


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CERTFLOW_ENCRYPTION_KEY", base64.b64encode(bytes(16)).decode(), "32 bytes, got 16"),
        ("CERTFLOW_ENCRYPTION_KEY", "not base64!", "base64"),
        ("CERTFLOW_DNS_RESOLVER", "127.0.0.1", "host:port"),
        ("CERTFLOW_DNS_RESOLVER", "127.0.0.1:99999", "out of range"),
        ("CERTFLOW_HTTP01_LISTEN", "0.0.0.0:http", "port must be a number"),
        ("CERTFLOW_ACME_CA_BUNDLE", "/nonexistent/ca.pem", "cannot read"),
        ("CERTFLOW_ACME_KEY_TYPE", "DSA1024", ""),
        ("CERTFLOW_DATABASE_URL", "mysql://x", "postgresql://"),
        ("CERTFLOW_ACME_DIRECTORY_URL", "acme.test/dir", "http(s) URL"),
        ("CERTFLOW_TEMPORAL_ADDRESS", "localhost", "host:port"),
    ],
)
def test_malformed_setting_names_the_variable(
    env: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    env.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(Settings)
    text = str(caught.value)
    assert text.startswith(variable + ":")
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize("variable", list(GOOD))
def test_missing_setting_names_the_variable(env: pytest.MonkeyPatch, variable: str) -> None:
    env.delenv(variable)
    with pytest.raises(ConfigError, match=f"^{variable} is not set( \\(or list the CAs in CERTFLOW_ISSUERS\\))?$"):
        load_settings(Settings)


def test_bundle_without_certificate(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("nothing here")
    env.setenv("CERTFLOW_ACME_CA_BUNDLE", str(bundle))
    with pytest.raises(ConfigError, match="CERTFLOW_ACME_CA_BUNDLE: .* holds no PEM certificate"):
        load_settings(Settings)


def test_client_settings_need_only_the_database(env: pytest.MonkeyPatch) -> None:
    env.delenv("CERTFLOW_ENCRYPTION_KEY")
    env.delenv("CERTFLOW_ACME_DIRECTORY_URL")
    settings = load_settings(ClientSettings)
    assert not isinstance(settings, Settings)
    assert settings.database_url.startswith("postgresql://")


def test_policy_from_settings(env: pytest.MonkeyPatch) -> None:
    env.setenv("CERTFLOW_DNS_RECHECK_INITIAL_SECONDS", "5")
    env.setenv("CERTFLOW_FAILED_RETRY_SECONDS", "0")
    policy = load_settings(Settings).provisioning_policy()
    assert policy.dns_recheck_initial_seconds == 5
    assert policy.failed_retry_seconds == 0
