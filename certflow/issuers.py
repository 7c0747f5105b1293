"""The certificate authorities certflow may order from, in order of preference.

``CERTFLOW_ISSUERS`` is a JSON list; each item names one ACME CA (its directory,
CA bundle, profile, External Account Binding, and the CAA issuer domains that
identify it). Without it, the single-CA settings (``CERTFLOW_ACME_DIRECTORY_URL``
and friends) make a one-item list named ``default``, so existing deployments do
not change. A certificate row issued before issuers existed belongs to the first.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from josepy.b64 import b64decode
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, field_validator, model_validator

DEFAULT_ISSUER = "default"
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_BASE64URL_RE = re.compile(r"[A-Za-z0-9_-]+={0,2}")
# RFC 8659 §4.2 issuer-domain-name: dot-separated labels of letters, digits and hyphens.
_ISSUER_DOMAIN_RE = re.compile(
    r"(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
)


class ExternalAccountBinding(BaseModel):
    """RFC 8555 §7.3.4: the key id and MAC key the CA gave out of band."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kid: str
    hmac_key: SecretStr
    """base64url, as ZeroSSL and Google Trust Services hand it out."""

    @field_validator("kid")
    @classmethod
    def _kid(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("hmac_key")
    @classmethod
    def _hmac_key(cls, value: SecretStr) -> SecretStr:
        text = value.get_secret_value().strip()
        if not text:
            raise ValueError("must not be empty")
        if not _BASE64URL_RE.fullmatch(text):
            raise ValueError("must be base64url")
        try:
            b64decode(text)
        except (binascii.Error, ValueError):
            raise ValueError("must be base64url") from None
        return SecretStr(text)


class Issuer(BaseModel):
    """One ACME CA certflow may order from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Shown on rows, events, webhooks and search attributes; keep it stable."""
    directory_url: str
    caa_domains: tuple[str, ...]
    """The CAA issuer-domain-names that authorize this CA (``letsencrypt.org``,
    ``sectigo.com`` for ZeroSSL, ``pki.goog``)."""
    ca_bundle: Path | None = None
    profile: str | None = None
    eab: ExternalAccountBinding | None = None
    dns_persist: bool = False
    """This CA offers dns-persist-01 (draft-ietf-acme-dns-persist; a persist record
    names one of its ``caa_domains``): ``auto`` may then choose it."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                f"must be 1-32 lower-case letters, digits or hyphens, got {value!r}"
            )
        return value

    @field_validator("directory_url")
    @classmethod
    def _directory_url(cls, value: str) -> str:
        value = value.strip()
        if not value.startswith(("https://", "http://")):
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value

    @field_validator("caa_domains", mode="before")
    @classmethod
    def _caa_domains(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError("must list at least one CAA issuer domain")
        domains = []
        for item in value:
            domain = str(item).strip().lower().rstrip(".")
            if not _ISSUER_DOMAIN_RE.fullmatch(domain):
                raise ValueError(f"{item!r} is not an RFC 8659 issuer-domain-name")
            domains.append(domain)
        return tuple(dict.fromkeys(domains))

    @field_validator("ca_bundle")
    @classmethod
    def _readable_bundle(cls, value: Path | None) -> Path | None:
        return readable_ca_bundle(value)

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @property
    def verify(self) -> str | bool:
        """What ``requests`` verifies the CA's TLS with."""
        return str(self.ca_bundle) if self.ca_bundle else True


def readable_ca_bundle(value: Path | None) -> Path | None:
    """A CA bundle must be a readable file holding a PEM certificate."""
    if value is None or not str(value).strip():
        return None
    try:
        text = value.read_text()
    except OSError as err:
        raise ValueError(f"cannot read {str(value)!r}: {err.strerror}") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError(f"{str(value)!r} holds no PEM certificate")
    return value


def parse_issuers(text: str) -> tuple[Issuer, ...]:
    """The ``CERTFLOW_ISSUERS`` list; ValueError names the item and the field."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"is not JSON: {err.msg} at character {err.pos}") from None
    if not isinstance(items, list) or not items:
        raise ValueError("must be a non-empty JSON list of issuers")
    issuers: list[Issuer] = []
    for position, item in enumerate(items, 1):
        label = f"item {position}"
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            label += f" ({item['name']})"
        if not isinstance(item, dict):
            raise ValueError(f"{label}: must be a JSON object")
        try:
            issuers.append(Issuer.model_validate(item))
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(part) for part in first["loc"] if not isinstance(part, int))
            message = str(first["msg"]).removeprefix("Value error, ")
            if first["type"] == "missing":
                message = "is not set"
            elif first["type"] == "extra_forbidden":
                message = "is not a field of an issuer"
            raise ValueError(f"{label}: {field}: {message}") from None
    _check_unique(issuers)
    return tuple(issuers)


def _check_unique(issuers: Sequence[Issuer]) -> None:
    """Names identify issuers on rows; directories identify accounts and cooldowns."""
    seen_names: dict[str, int] = {}
    seen_urls: dict[str, int] = {}
    for position, issuer in enumerate(issuers, 1):
        if issuer.name in seen_names:
            raise ValueError(
                f"item {position} ({issuer.name}): name: item {seen_names[issuer.name]}"
                " has the same name"
            )
        if issuer.directory_url in seen_urls:
            raise ValueError(
                f"item {position} ({issuer.name}): directory_url: item"
                f" {seen_urls[issuer.directory_url]} has the same directory"
            )
        seen_names[issuer.name] = position
        seen_urls[issuer.directory_url] = position


class Issuers(BaseModel):
    """The configured issuers, in order of preference; lookups by name."""

    model_config = ConfigDict(frozen=True)

    items: tuple[Issuer, ...]

    @model_validator(mode="after")
    def _not_empty(self) -> Issuers:
        if not self.items:
            raise ValueError("at least one issuer is needed")
        _check_unique(self.items)
        return self

    @property
    def names(self) -> list[str]:
        return [issuer.name for issuer in self.items]

    def named(self, name: str | None) -> Issuer:
        """The issuer called ``name``; ``None`` (rows and histories from before
        issuers) is the first. KeyError for a name no longer configured."""
        if name is None:
            return self.items[0]
        for issuer in self.items:
            if issuer.name == name:
                return issuer
        raise KeyError(name)
