"""Settings from ``CERTFLOW_*`` environment variables: what a client of certflow
reads (``ClientSettings``, ``KeySettings``), and how any settings are loaded.

The worker's (``Settings``) extend these in certflow/worker_settings.py, so that
a client loads none of what validates them. A missing or malformed setting stops
the process at start with one line that names the variable
(:func:`load_settings` raises :class:`ConfigError`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, TypeVar

from pydantic import SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from certflow.errors import ConfigError

ENV_PREFIX = "CERTFLOW_"
S = TypeVar("S", bound="ClientSettings")


def parse_host_port(value: str, *, default_host: str | None = None) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[::1]:53``); the port is mandatory."""
    value = value.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text:
        raise ValueError(f"expected host:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        if default_host is None:
            raise ValueError(f"expected host:port, got {value!r}")
        host = default_host
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port must be a number in {value!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {value!r}")
    return host, port


def decode_encryption_key(value: str) -> bytes:
    """Decode a standard-base64 AES-256 key, insisting on exactly 32 bytes."""
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be standard base64") from None
    if len(raw) != 32:
        raise ValueError(f"must decode to 32 bytes, got {len(raw)}")
    return raw


class ClientSettings(BaseSettings):
    """What a client of certflow (starter.py, a product backend) needs."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    ownership_secret: SecretStr | None = None
    """OWNERSHIP_SECRET: with it, the client shows each tenant the record that
    proves ownership (certflow.dns.ownership)."""

    database_url: str
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = "default"
    task_queue: str = "certflow"

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str) -> str:
        value = value.strip()
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @field_validator("temporal_address")
    @classmethod
    def _temporal_host_port(cls, value: str) -> str:
        parse_host_port(value)
        return value.strip()

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
