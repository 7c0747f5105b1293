"""Temporal's connection settings: read as the temporal CLI reads them (profile file,
TEMPORAL_*), overridden by CERTFLOW_TEMPORAL_*, and every mistake that needs no
network is one ConfigError naming the setting that holds the value.

Each refusal test goes red when its check in certflow/connect/temporal_config.py is
removed (checked once: with ``_check_client_pair``'s comparison taken out, the
mismatched-key test fails)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from certflow.errors import ConfigError
from certflow.connect.settings import ClientSettings, load_settings
from certflow.connect.temporal_config import load_temporal_connection
from devstack.servers import write_tls_files


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    other_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    one = tmp_path_factory.mktemp("pki-one")
    two = tmp_path_factory.mktemp("pki-two")
    ca, cert, key = write_tls_files(one)
    _, _, other_key = write_tls_files(two)
    yield Pki(ca, cert, key, other_key)


@pytest.fixture
def env(clean_environment: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    clean_environment.setenv("CERTFLOW_DATABASE_URL", "postgresql://postgres@127.0.0.1/certflow")
    return clean_environment


def _load() -> object:
    return load_temporal_connection(load_settings(ClientSettings))


def _refused(match: str) -> str:
    with pytest.raises(ConfigError, match=match) as caught:
        _load()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_plaintext_local_by_default(env: pytest.MonkeyPatch) -> None:
    connection = load_temporal_connection(load_settings(ClientSettings))
    assert (connection.address, connection.namespace) == ("localhost:7233", "default")
    assert connection.tls is None and connection.api_key is None


def test_temporal_variables_are_read_and_an_api_key_turns_tls_on(env: pytest.MonkeyPatch) -> None:
    env.setenv("TEMPORAL_ADDRESS", "ns.acct.tmprl.cloud:7233")
    env.setenv("TEMPORAL_NAMESPACE", "ns.acct")
    env.setenv("TEMPORAL_API_KEY", "secret-key")
    connection = load_temporal_connection(load_settings(ClientSettings))
    assert connection.address == "ns.acct.tmprl.cloud:7233"
    assert connection.namespace == "ns.acct"
    assert connection.api_key == "secret-key"
    assert connection.tls is not None
    assert connection.api_key_setting == "TEMPORAL_API_KEY"
    assert "secret-key" not in repr(connection)


def test_certflow_settings_override_temporal_ones(env: pytest.MonkeyPatch) -> None:
    env.setenv("TEMPORAL_ADDRESS", "from-temporal:7233")
    env.setenv("TEMPORAL_API_KEY", "from-temporal")
    env.setenv("CERTFLOW_TEMPORAL_ADDRESS", "from-certflow:7233")
    env.setenv("CERTFLOW_TEMPORAL_API_KEY", "from-certflow")
    connection = load_temporal_connection(load_settings(ClientSettings))
    assert connection.address == "from-certflow:7233"
    assert connection.api_key == "from-certflow"
    assert connection.address_setting == "CERTFLOW_TEMPORAL_ADDRESS"
    assert connection.api_key_setting == "CERTFLOW_TEMPORAL_API_KEY"


def test_a_profile_file_with_mtls(env: pytest.MonkeyPatch, pki: Pki, tmp_path: Path) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(
        "[profile.prod]\n"
        'address = "ns.acct.tmprl.cloud:7233"\n'
        'namespace = "ns.acct"\n'
        "[profile.prod.tls]\n"
        f'server_ca_cert_path = "{pki.ca}"\n'
        f'client_cert_path = "{pki.cert}"\n'
        f'client_key_path = "{pki.key}"\n'
        'server_name = "temporal.internal"\n'
    )
    env.setenv("TEMPORAL_CONFIG_FILE", str(config))
    env.setenv("TEMPORAL_PROFILE", "prod")
    connection = load_temporal_connection(load_settings(ClientSettings))
    assert connection.tls is not None
    assert connection.tls.client_cert == pki.cert.read_bytes()
    assert connection.tls.client_private_key == pki.key.read_bytes()
    assert connection.tls.server_root_ca_cert == pki.ca.read_bytes()
    assert connection.tls.domain == "temporal.internal"
    assert connection.mutual_tls
    assert connection.client_cert_setting == f"tls.client_cert in profile 'prod' of {config}"


def test_pem_given_inline(env: pytest.MonkeyPatch, pki: Pki) -> None:
    env.setenv("CERTFLOW_TEMPORAL_TLS_CERT", pki.cert.read_text())
    env.setenv("CERTFLOW_TEMPORAL_TLS_KEY", pki.key.read_text())
    connection = load_temporal_connection(load_settings(ClientSettings))
    assert connection.tls is not None
    assert connection.tls.client_cert is not None
    assert connection.tls.client_cert.strip() == pki.cert.read_bytes().strip()
    assert b"PRIVATE KEY" not in repr(connection).encode()  # the key is never shown


def test_an_unreadable_file_names_its_setting(env: pytest.MonkeyPatch, pki: Pki) -> None:
    env.setenv("CERTFLOW_TEMPORAL_TLS_CERT", "/nonexistent/client.pem")
    env.setenv("CERTFLOW_TEMPORAL_TLS_KEY", str(pki.key))
    message = _refused("CERTFLOW_TEMPORAL_TLS_CERT: cannot read /nonexistent/client.pem")
    assert "No such file" in message


def test_an_unreadable_temporal_variable_file_names_that_variable(env: pytest.MonkeyPatch) -> None:
    env.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", "/nonexistent/ca.pem")
    _refused("^TEMPORAL_TLS_SERVER_CA_CERT_PATH: cannot read")


def test_a_key_that_does_not_match_its_certificate(env: pytest.MonkeyPatch, pki: Pki) -> None:
    env.setenv("CERTFLOW_TEMPORAL_TLS_CERT", str(pki.cert))
    env.setenv("CERTFLOW_TEMPORAL_TLS_KEY", str(pki.other_key))
    _refused("^CERTFLOW_TEMPORAL_TLS_KEY: the key does not match the certificate of CERTFLOW_TEMPORAL_TLS_CERT")


def test_a_certificate_without_its_key(env: pytest.MonkeyPatch, pki: Pki) -> None:
    env.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(pki.cert))
    _refused("^TEMPORAL_TLS_CLIENT_CERT_PATH is set without its key")


def test_a_ca_that_is_not_pem(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(base64.b64encode(b"not a certificate"))
    env.setenv("CERTFLOW_TEMPORAL_TLS_CA", str(ca))
    _refused("^CERTFLOW_TEMPORAL_TLS_CA: not a PEM certificate")


def test_an_api_key_with_tls_turned_off(env: pytest.MonkeyPatch) -> None:
    env.setenv("CERTFLOW_TEMPORAL_API_KEY", "secret-key")
    env.setenv("CERTFLOW_TEMPORAL_TLS", "false")
    message = _refused("^CERTFLOW_TEMPORAL_API_KEY: an API key is only ever sent over TLS")
    assert "secret-key" not in message


def test_an_api_key_with_temporal_tls_off(env: pytest.MonkeyPatch) -> None:
    env.setenv("TEMPORAL_API_KEY", "secret-key")
    env.setenv("TEMPORAL_TLS", "false")
    _refused("^TEMPORAL_API_KEY: an API key is only ever sent over TLS, and TEMPORAL_TLS turns TLS off")


def test_a_missing_profile_file_or_profile(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "absent.toml"))
    _refused("^TEMPORAL_CONFIG_FILE: cannot read .*absent.toml: no such file")
    env.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "empty.toml"))
    (tmp_path / "empty.toml").write_text("")
    env.setenv("TEMPORAL_PROFILE", "prod")
    _refused("prod")


def test_a_malformed_override(env: pytest.MonkeyPatch) -> None:
    env.setenv("CERTFLOW_TEMPORAL_ADDRESS", "no-port")
    with pytest.raises(ConfigError, match="^CERTFLOW_TEMPORAL_ADDRESS: expected host:port"):
        load_settings(ClientSettings)
