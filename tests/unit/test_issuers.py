"""The issuers setting (CERTFLOW_ISSUERS): parsing, its one-line errors, and the
single-CA settings as a one-item list."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from certflow.errors import ConfigError
from certflow.issuers import DEFAULT_ISSUER, Issuers
from certflow.connect.settings import load_settings
from certflow.running.worker_settings import Settings

MAC_KEY = base64.urlsafe_b64encode(b"k" * 32).rstrip(b"=").decode()
LETSENCRYPT = {
    "name": "letsencrypt",
    "directory_url": "https://acme-v02.api.letsencrypt.org/directory",
    "caa_domains": ["letsencrypt.org"],
}
ZEROSSL = {
    "name": "zerossl",
    "directory_url": "https://acme.zerossl.com/v2/DV90",
    "caa_domains": ["sectigo.com", "zerossl.com"],
    "eab": {"kid": "kid-1", "hmac_key": MAC_KEY},
}
BASE = {
    "CERTFLOW_DATABASE_URL": "postgresql://postgres@127.0.0.1/certflow",
    "CERTFLOW_ENCRYPTION_KEY": base64.b64encode(bytes(32)).decode(),
    "CERTFLOW_CNAME_TARGET": "edge.saas.test",
    "CERTFLOW_DNS_RESOLVER": "127.0.0.1:53",
}


@pytest.fixture
def env(clean_environment: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name, value in BASE.items():
        clean_environment.setenv(name, value)
    return clean_environment


def _load(env: pytest.MonkeyPatch, issuers: Any) -> Settings:
    env.setenv("CERTFLOW_ISSUERS", issuers if isinstance(issuers, str) else json.dumps(issuers))
    return load_settings(Settings)


def test_the_list_in_order_with_its_bindings(env: pytest.MonkeyPatch) -> None:
    issuers = _load(env, [LETSENCRYPT, ZEROSSL]).issuer_list
    assert issuers.names == ["letsencrypt", "zerossl"]
    zerossl = issuers.named("zerossl")
    assert zerossl.caa_domains == ("sectigo.com", "zerossl.com")
    assert zerossl.eab is not None and zerossl.eab.kid == "kid-1"
    assert MAC_KEY not in repr(zerossl)  # the MAC key is a secret
    assert MAC_KEY not in repr(_load(env, [LETSENCRYPT, ZEROSSL]))  # also in the raw setting
    assert issuers.named(None).name == "letsencrypt"  # rows from before issuers
    assert _load(env, [LETSENCRYPT, ZEROSSL]).provisioning_policy().issuers == [
        "letsencrypt",
        "zerossl",
    ]


def test_single_ca_settings_are_a_one_item_list(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    env.setenv("CERTFLOW_ACME_DIRECTORY_URL", "https://acme.test/dir")
    env.setenv("CERTFLOW_ACME_CA_BUNDLE", str(bundle))
    env.setenv("CERTFLOW_ACME_PROFILE", "shortlived")
    env.setenv("CERTFLOW_CAA_ISSUER_DOMAIN", "Example-CA.test.")
    issuers = load_settings(Settings).issuer_list
    assert issuers == Issuers(items=(issuers.items[0],))
    only = issuers.items[0]
    assert only.name == DEFAULT_ISSUER
    assert only.directory_url == "https://acme.test/dir"
    assert only.caa_domains == ("example-ca.test",)
    assert only.profile == "shortlived" and only.verify == str(bundle)


@pytest.mark.parametrize(
    ("issuers", "message"),
    [
        ("[{", "CERTFLOW_ISSUERS: is not JSON: "),
        ("[]", "CERTFLOW_ISSUERS: must be a non-empty JSON list of issuers"),
        ('{"name": "x"}', "CERTFLOW_ISSUERS: must be a non-empty JSON list of issuers"),
        ([LETSENCRYPT, "zerossl"], "CERTFLOW_ISSUERS: item 2: must be a JSON object"),
        (
            [LETSENCRYPT, {**ZEROSSL, "eab": {"kid": "kid-1", "hmac_key": "not base64url!"}}],
            "CERTFLOW_ISSUERS: item 2 (zerossl): eab.hmac_key: must be base64url",
        ),
        (
            [LETSENCRYPT, {**ZEROSSL, "eab": {"kid": "kid-1"}}],
            "CERTFLOW_ISSUERS: item 2 (zerossl): eab.hmac_key: is not set",
        ),
        (
            [{k: v for k, v in LETSENCRYPT.items() if k != "directory_url"}],
            "CERTFLOW_ISSUERS: item 1 (letsencrypt): directory_url: is not set",
        ),
        (
            [{**LETSENCRYPT, "directory_url": "acme-v02.api.letsencrypt.org"}],
            "CERTFLOW_ISSUERS: item 1 (letsencrypt): directory_url: must be an http(s) URL",
        ),
        (
            [{**LETSENCRYPT, "caa_domains": []}],
            "CERTFLOW_ISSUERS: item 1 (letsencrypt): caa_domains: must list at least one",
        ),
        (
            [{**LETSENCRYPT, "caa_domains": ["lets encrypt"]}],
            "CERTFLOW_ISSUERS: item 1 (letsencrypt): caa_domains: 'lets encrypt' is not an",
        ),
        (
            [{**LETSENCRYPT, "name": "Let's Encrypt"}],
            "CERTFLOW_ISSUERS: item 1 (Let's Encrypt): name: must be 1-32 lower-case",
        ),
        (
            [{**LETSENCRYPT, "ca_bundle": "/nonexistent/ca.pem"}],
            "CERTFLOW_ISSUERS: item 1 (letsencrypt): ca_bundle: cannot read",
        ),
        (
            [{**LETSENCRYPT, "eab_kid": "kid-1"}],
            "CERTFLOW_ISSUERS: item 1 (letsencrypt): eab_kid: is not a field of an issuer",
        ),
        (
            [LETSENCRYPT, {**ZEROSSL, "name": "letsencrypt"}],
            "CERTFLOW_ISSUERS: item 2 (letsencrypt): name: item 1 has the same name",
        ),
        (
            [LETSENCRYPT, {**ZEROSSL, "directory_url": LETSENCRYPT["directory_url"]}],
            "CERTFLOW_ISSUERS: item 2 (zerossl): directory_url: item 1 has the same directory",
        ),
    ],
)
def test_a_malformed_list_is_one_line_naming_item_and_field(
    env: pytest.MonkeyPatch, issuers: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(env, issuers)
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_one_way_to_name_the_ca(env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="^CERTFLOW_ACME_DIRECTORY_URL is not set"):
        load_settings(Settings)
    env.setenv("CERTFLOW_ACME_DIRECTORY_URL", "https://acme.test/dir")
    with pytest.raises(ConfigError, match="^CERTFLOW_ACME_DIRECTORY_URL is set with CERTFLOW_ISSUERS"):
        _load(env, [LETSENCRYPT])
