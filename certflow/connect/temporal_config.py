"""Where and how to reach Temporal: address, namespace, TLS, mTLS, API key.

Read as every Temporal tool reads it (``temporalio.envconfig``: the profile file
``TEMPORAL_CONFIG_FILE`` or ``~/.config/temporalio/temporal.toml``, its profile
``TEMPORAL_PROFILE``, and the ``TEMPORAL_*`` variables), then overridden by
certflow's own ``CERTFLOW_TEMPORAL_*`` settings. Everything that can be checked
without the network is checked here, at start: a file that cannot be read, a
PEM that does not parse, a key that does not match its certificate, a
certificate without its key, an API key with TLS turned off. Each is a
:class:`ConfigError` naming the setting that holds the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from temporalio.envconfig import ClientConfigProfile, DataSource
from temporalio.service import TLSConfig

from certflow.errors import ConfigError
from certflow.connect.settings import ClientSettings

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
_OVERRIDE = "CERTFLOW_TEMPORAL_"


@dataclass(frozen=True)
class TemporalConnection:
    """Everything ``Client.connect`` needs, checked, and where each part came from
    (the setting an operator must look at when the server refuses it)."""

    address: str
    namespace: str
    tls: TLSConfig | None = field(default=None, repr=False)  # holds the client key
    api_key: str | None = field(default=None, repr=False)
    rpc_metadata: Mapping[str, str] = field(default_factory=dict, repr=False)
    address_setting: str = _OVERRIDE + "ADDRESS"
    ca_setting: str | None = None
    """Where the server's CA came from (None: the system's roots)."""
    server_name_setting: str | None = None
    client_cert_setting: str | None = None
    api_key_setting: str | None = None

    @property
    def mutual_tls(self) -> bool:
        return self.client_cert_setting is not None

    @property
    def tls_settings(self) -> list[str]:
        """The settings behind the TLS parts, for "check …" messages."""
        named = [self.ca_setting, self.server_name_setting, self.client_cert_setting]
        return [s for s in named if s is not None] or [_OVERRIDE + "TLS_CA"]


class _Sources:
    """Names the setting each value came from: certflow's override, a TEMPORAL_*
    variable, or the profile in the file."""

    def __init__(self, environ: Mapping[str, str], profile: str, config_file: str | None) -> None:
        self._environ = environ
        file = config_file or "~/.config/temporalio/temporal.toml"
        self._profile = f"profile {profile!r} of {file}"

    def name(self, override: str, overridden: object, *temporal_variables: str, toml_key: str) -> str:
        """``overridden``: certflow's own setting's value (None when unset)."""
        if overridden is not None:
            return _OVERRIDE + override
        for variable in temporal_variables:
            if self._environ.get(variable, "").strip():
                return variable
        return f"{toml_key} in {self._profile}"


def _source_of(value: str | None) -> DataSource | None:
    """A setting given as a path or as the PEM itself."""
    if value is None or not value.strip():
        return None
    return value.encode() if value.lstrip().startswith("-----BEGIN") else Path(value.strip())


def _read(source: DataSource | None, setting: str) -> bytes | None:
    if source is None:
        return None
    if isinstance(source, Path):
        try:
            return source.read_bytes()
        except OSError as err:
            raise ConfigError(f"{setting}: cannot read {source}: {err.strerror or err}") from None
    return source.encode() if isinstance(source, str) else source


def _certificates(pem: bytes, setting: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError:
        found = []
    if not found:
        raise ConfigError(f"{setting}: not a PEM certificate")
    return found


def _check_client_pair(cert_pem: bytes, key_pem: bytes, cert_setting: str, key_setting: str) -> None:
    leaf = _certificates(cert_pem, cert_setting)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"{key_setting}: not an unencrypted PEM private key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, public) != leaf.public_key().public_bytes(der, public):
        raise ConfigError(f"{key_setting}: the key does not match the certificate of {cert_setting}")


def _load_profile(settings: ClientSettings, env: Mapping[str, str]) -> tuple[ClientConfigProfile, _Sources]:
    """Temporal's client profile (file, profile name, TEMPORAL_* variables), and the
    names of where each of its values came from."""
    profile_name = settings.temporal_profile or env.get("TEMPORAL_PROFILE") or "default"
    config_file = settings.temporal_config_file or env.get("TEMPORAL_CONFIG_FILE") or None
    file_setting = (
        _OVERRIDE + "CONFIG_FILE" if settings.temporal_config_file else "TEMPORAL_CONFIG_FILE"
    )
    if config_file is not None and not os.access(config_file, os.R_OK):
        reason = "no such file" if not os.path.exists(config_file) else "not readable"
        raise ConfigError(f"{file_setting}: cannot read {config_file}: {reason}")
    try:
        profile = ClientConfigProfile.load(
            # None lets the SDK apply TEMPORAL_PROFILE, or "default" when the file has it.
            profile=settings.temporal_profile,
            config_source=Path(config_file) if config_file else None,
            override_env_vars=env,
        )
    except Exception as err:  # the SDK's core raises its own ConfigError type
        setting = (
            _OVERRIDE + "PROFILE" if settings.temporal_profile
            else "TEMPORAL_PROFILE" if env.get("TEMPORAL_PROFILE")
            else file_setting
        )
        raise ConfigError(f"{setting}: {str(err).splitlines()[0]}") from None
    return profile, _Sources(env, profile_name, config_file)


@dataclass(frozen=True)
class _TlsMaterial:
    """The TLS parts as given (certflow's override, else the profile), read, each
    with the name of the setting it came from."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None = field(repr=False)
    server_name: str | None
    ca_setting: str
    cert_setting: str
    key_setting: str
    name_setting: str

    @classmethod
    def read(cls, settings: ClientSettings, profile: ClientConfigProfile, sources: _Sources) -> _TlsMaterial:
        tls = profile.tls
        ca_setting = sources.name(
            "TLS_CA", settings.temporal_tls_ca, "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
            "TEMPORAL_TLS_SERVER_CA_CERT_DATA", toml_key="tls.server_ca_cert",
        )
        cert_setting = sources.name(
            "TLS_CERT", settings.temporal_tls_cert, "TEMPORAL_TLS_CLIENT_CERT_PATH",
            "TEMPORAL_TLS_CLIENT_CERT_DATA", toml_key="tls.client_cert",
        )
        key_setting = sources.name(
            "TLS_KEY", settings.temporal_tls_key, "TEMPORAL_TLS_CLIENT_KEY_PATH",
            "TEMPORAL_TLS_CLIENT_KEY_DATA", toml_key="tls.client_key",
        )
        name_setting = sources.name(
            "TLS_SERVER_NAME", settings.temporal_tls_server_name, "TEMPORAL_TLS_SERVER_NAME",
            toml_key="tls.server_name",
        )
        key_override = (
            settings.temporal_tls_key.get_secret_value() if settings.temporal_tls_key is not None else None
        )
        return cls(
            ca=_read(_source_of(settings.temporal_tls_ca) or (tls.server_root_ca_cert if tls else None), ca_setting),
            cert=_read(_source_of(settings.temporal_tls_cert) or (tls.client_cert if tls else None), cert_setting),
            key=_read(_source_of(key_override) or (tls.client_private_key if tls else None), key_setting),
            server_name=settings.temporal_tls_server_name or (tls.server_name if tls else None),
            ca_setting=ca_setting,
            cert_setting=cert_setting,
            key_setting=key_setting,
            name_setting=name_setting,
        )

    @property
    def given(self) -> list[str]:
        """The settings of the parts given, in order."""
        parts = {
            self.ca_setting: self.ca, self.cert_setting: self.cert,
            self.key_setting: self.key, self.name_setting: self.server_name,
        }
        return [setting for setting, value in parts.items() if value]

    def check(self) -> None:
        """A certificate with its key, PEMs that parse, a key that matches."""
        if self.cert is not None and self.key is None:
            raise ConfigError(f"{self.cert_setting} is set without its key ({self.key_setting})")
        if self.key is not None and self.cert is None:
            raise ConfigError(f"{self.key_setting} is set without its certificate ({self.cert_setting})")
        if self.ca is not None:
            _certificates(self.ca, self.ca_setting)
        if self.cert is not None and self.key is not None:
            _check_client_pair(self.cert, self.key, self.cert_setting, self.key_setting)


def load_temporal_connection(
    settings: ClientSettings, environ: Mapping[str, str] | None = None
) -> TemporalConnection:
    """The connection the settings and Temporal's client configuration describe;
    ConfigError (naming the setting) for anything wrong before the network."""
    # An empty variable is an unset one (a harness blanks the caller's TEMPORAL_*).
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if v.strip()}
    profile, sources = _load_profile(settings, env)
    address_setting = (
        sources.name("ADDRESS", settings.temporal_address, "TEMPORAL_ADDRESS", toml_key="address")
        if settings.temporal_address or profile.address
        else _OVERRIDE + "ADDRESS"
    )
    address = settings.temporal_address or profile.address or DEFAULT_ADDRESS
    namespace = settings.temporal_namespace or profile.namespace or DEFAULT_NAMESPACE
    api_key = (
        settings.temporal_api_key.get_secret_value().strip() or None
        if settings.temporal_api_key is not None
        else profile.api_key
    )
    tls = _TlsMaterial.read(settings, profile, sources)
    if settings.temporal_tls is not None:
        tls_wanted: bool | None = settings.temporal_tls
        tls_switch = _OVERRIDE + "TLS"
    else:
        tls_wanted = None if profile.tls is None or profile.tls.disabled is None else not profile.tls.disabled
        tls_switch = sources.name("TLS", None, "TEMPORAL_TLS", toml_key="tls.disabled")
    api_key_setting = (
        sources.name("API_KEY", settings.temporal_api_key, "TEMPORAL_API_KEY", toml_key="api_key")
        if api_key
        else None
    )
    plain = TemporalConnection(address, namespace, rpc_metadata=profile.grpc_meta, address_setting=address_setting)
    if tls_wanted is False:
        if api_key_setting is not None:
            raise ConfigError(
                f"{api_key_setting}: an API key is only ever sent over TLS, and {tls_switch} turns TLS off"
            )
        if tls.given:
            raise ConfigError(f"{tls.given[0]} is set, but {tls_switch} turns TLS off")
        return plain
    tls.check()
    if not (tls_wanted or tls.given or api_key):
        return plain
    return TemporalConnection(
        address,
        namespace,
        tls=TLSConfig(
            server_root_ca_cert=tls.ca, domain=tls.server_name, client_cert=tls.cert, client_private_key=tls.key
        ),
        api_key=api_key,
        rpc_metadata=profile.grpc_meta,
        address_setting=address_setting,
        ca_setting=tls.ca_setting if tls.ca is not None else None,
        server_name_setting=tls.name_setting if tls.server_name else None,
        client_cert_setting=tls.cert_setting if tls.cert is not None else None,
        api_key_setting=api_key_setting,
    )
