"""Settings from ``CERTFLOW_*`` environment variables: what a client of certflow
reads (``ClientSettings``, ``KeySettings``), and how any settings are loaded.

The worker's (``Settings``) extend these in certflow/running/worker_settings.py, so that
a client loads none of what validates them. A missing or malformed setting stops
the process at start with one line that names the variable
(:func:`load_settings` raises :class:`ConfigError`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any, TypeVar

from pydantic import SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from certflow.hostnames import parse_host_port
from certflow.errors import ConfigError

ENV_PREFIX = "CERTFLOW_"
S = TypeVar("S", bound=BaseSettings)


def decode_encryption_key(value: str) -> bytes:
    """Decode a standard-base64 AES-256 key, insisting on exactly 32 bytes."""
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be standard base64") from None
    if len(raw) != 32:
        raise ValueError(f"must decode to 32 bytes, got {len(raw)}")
    return raw


class PayloadSettings(BaseSettings):
    """What encrypts Temporal payloads (certflow/connect/payload_codec.py): every process
    that talks to Temporal, and the codec server, reads these."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    payload_key: SecretStr | None = None
    """PAYLOAD_KEY: ``[key-id:]<base64 of 32 bytes>``; with it every payload certflow
    sends to Temporal is AES-256-GCM encrypted under this key (off without it)."""
    payload_keys_old: SecretStr | None = None
    """PAYLOAD_KEYS_OLD: comma-separated retired keys, same form, that still decrypt."""

    @field_validator("payload_key")
    @classmethod
    def _valid_payload_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        parse_payload_key(value.get_secret_value())
        return value

    @field_validator("payload_keys_old")
    @classmethod
    def _valid_old_payload_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        for position, part in enumerate(value.get_secret_value().split(","), 1):
            try:
                parse_payload_key(part)
            except ValueError as err:
                raise ValueError(f"key {position}: {err}") from None
        return value

    @property
    def payload_key_pair(self) -> tuple[str, bytes] | None:
        """(key id, key) that encrypts; None: payloads are sent as they are."""
        if self.payload_key is None:
            return None
        return parse_payload_key(self.payload_key.get_secret_value())

    @property
    def old_payload_key_pairs(self) -> list[tuple[str, bytes]]:
        """(key id, key) of each retired key: they decrypt, never encrypt."""
        if self.payload_keys_old is None:
            return []
        return [parse_payload_key(k) for k in self.payload_keys_old.get_secret_value().split(",")]


class CodecServerSettings(PayloadSettings):
    """``certflow codec-server``: decodes payloads for the Temporal Web UI and CLI,
    for operators only (a bearer secret, client certificates, or both)."""

    codec_listen: str = "127.0.0.1:8089"
    codec_secret: SecretStr | None = None
    """CODEC_SECRET: callers send ``Authorization: Bearer <it>`` (at least 16 characters)."""
    codec_cors_origins: str = ""
    """CODEC_CORS_ORIGINS: comma-separated origins of the Temporal Web UI allowed to
    call from a browser (e.g. ``https://cloud.temporal.io``)."""
    codec_tls_cert: str | None = None
    codec_tls_key: str | None = None
    codec_tls_client_ca: str | None = None
    """CODEC_TLS_CLIENT_CA: with it, only callers with a client certificate from this CA."""

    @field_validator("codec_listen")
    @classmethod
    def _codec_host_port(cls, value: str) -> str:
        parse_host_port(value)
        return value.strip()

    @field_validator("codec_secret")
    @classmethod
    def _codec_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        if len(value.get_secret_value().strip()) < 16:
            raise ValueError("must be at least 16 characters")
        return value

    @model_validator(mode="after")
    def _operators_only(self) -> CodecServerSettings:
        if self.payload_key is None and self.payload_keys_old is None:
            raise ValueError("payload_key: is not set: the codec server has no key to decode with")
        if self.codec_secret is None and self.codec_tls_client_ca is None:
            raise ValueError(
                "codec_secret: is not set, nor CERTFLOW_CODEC_TLS_CLIENT_CA:"
                " the codec server decodes for operators only, so it needs one of them"
            )
        if (self.codec_tls_cert is None) != (self.codec_tls_key is None):
            raise ValueError("codec_tls_cert: and CERTFLOW_CODEC_TLS_KEY go together")
        if self.codec_tls_client_ca is not None and self.codec_tls_cert is None:
            raise ValueError("codec_tls_client_ca: needs CERTFLOW_CODEC_TLS_CERT and _KEY (the server's TLS)")
        return self

    @property
    def cors_origins(self) -> frozenset[str]:
        return frozenset(o.strip().rstrip("/") for o in self.codec_cors_origins.split(",") if o.strip())


class ClientSettings(PayloadSettings):
    """What a client of certflow (starter.py, a product backend) needs."""

    ownership_secret: SecretStr | None = None
    """OWNERSHIP_SECRET: with it, the client shows each tenant the record that
    proves ownership (certflow.dns.ownership)."""

    database_url: str
    task_queue: str = "certflow"

    # Temporal: each of these overrides what Temporal's own client configuration
    # says (the profile file and TEMPORAL_* variables the temporal CLI reads; see
    # certflow/connect/temporal_config.py). Unset, that configuration decides.
    temporal_address: str | None = None
    temporal_namespace: str | None = None
    temporal_api_key: SecretStr | None = None
    temporal_tls: bool | None = None
    temporal_tls_ca: str | None = None
    """The server's CA: a PEM file's path, or the PEM itself."""
    temporal_tls_cert: str | None = None
    """The client certificate (mTLS): a path, or the PEM."""
    temporal_tls_key: SecretStr | None = None
    """The client certificate's key: a path, or the PEM."""
    temporal_tls_server_name: str | None = None
    temporal_profile: str | None = None
    temporal_config_file: str | None = None
    hostname_search_attribute: bool = True
    """HOSTNAME_SEARCH_ATTRIBUTE: false keeps the hostname out of the
    CertificateHostname search attribute (search attributes are never encrypted)."""

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str) -> str:
        value = value.strip()
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @field_validator("temporal_address")
    @classmethod
    def _temporal_host_port(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parse_host_port(value)
        return value.strip()

    @field_validator(
        "temporal_namespace", "temporal_tls_ca", "temporal_tls_cert", "temporal_tls_server_name",
        "temporal_profile", "temporal_config_file",
    )
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("ownership_secret")
    @classmethod
    def _ownership_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        try:
            raw = base64.b64decode(value.get_secret_value().strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be standard base64") from None
        if len(raw) < 16:
            raise ValueError(f"must decode to at least 16 bytes, got {len(raw)}")
        return value

    @property
    def ownership_secret_bytes(self) -> bytes | None:
        if self.ownership_secret is None:
            return None
        return base64.b64decode(self.ownership_secret.get_secret_value().strip())


class KeySettings(ClientSettings):
    """A client that also handles key material (starter.py rotate-keys)."""

    encryption_key: SecretStr
    encryption_keys_old: SecretStr | None = None
    """Retired keys (comma-separated base64) that still decrypt until rotate-keys ran."""

    @field_validator("encryption_key")
    @classmethod
    def _valid_key(cls, value: SecretStr) -> SecretStr:
        decode_encryption_key(value.get_secret_value())
        return value

    @field_validator("encryption_keys_old")
    @classmethod
    def _valid_old_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        for position, part in enumerate(value.get_secret_value().split(","), 1):
            try:
                decode_encryption_key(part)
            except ValueError as err:
                raise ValueError(f"key {position}: {err}") from None
        return value

    @property
    def encryption_key_bytes(self) -> bytes:
        return decode_encryption_key(self.encryption_key.get_secret_value())

    @property
    def old_encryption_keys_bytes(self) -> list[bytes]:
        if self.encryption_keys_old is None:
            return []
        return [decode_encryption_key(k) for k in self.encryption_keys_old.get_secret_value().split(",")]



_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def parse_payload_key(value: str) -> tuple[str, bytes]:
    """``[key-id:]<base64>`` as (key id, 32-byte key). Without an id the key's own
    fingerprint is its id, so a wrong key is told apart from a retired one."""
    key_id, sep, encoded = value.strip().rpartition(":")
    key = decode_encryption_key(encoded)
    if not sep:
        return "k" + hashlib.sha256(key).hexdigest()[:12], key
    if not _KEY_ID.fullmatch(key_id):
        raise ValueError("the key id (before ':') must be 1-64 letters, digits, '.', '_' or '-'")
    return key_id, key


def load_settings(kind: type[S], **overrides: Any) -> S:
    """Read settings from the environment; raise ConfigError naming the first bad variable."""
    try:
        return kind(**overrides)
    except ValidationError as err:
        first = err.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        if not first["loc"]:  # a check across settings names its variable first
            field, _, message = message.partition(": ")
            raise ConfigError(f"{ENV_PREFIX}{field.upper()} {message}") from None
        variable = ENV_PREFIX + str(first["loc"][0]).upper()
        if first["type"] == "missing":
            raise ConfigError(f"{variable} is not set") from None
        raise ConfigError(f"{variable}: {message}") from None
