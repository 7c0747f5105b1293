"""Everything the worker is configured with (``Settings``): the CAs, DNS, the edge,
the provisioning policy handed to workflows, pacing toward the CA, webhooks,
dns-01, logs and metrics.

It extends the client's settings (certflow/connect/settings.py, which also loads it) and
needs what validates its values — issuers, DNS zones, reserved addresses — that a
client never imports.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from certflow.crypto import KeyType
from certflow.dns.dns01 import Dns01Zone
from certflow.dns.tsig import TsigKey
from certflow.dns.reserved import AddressPolicy
from certflow.hostnames import InvalidHostnameError, normalize_hostname
from certflow.issuers import DEFAULT_ISSUER, Issuer, Issuers, parse_issuers, readable_ca_bundle
from certflow.hostnames import parse_host_port
from certflow.connect.settings import KeySettings
from certflow.workflow_payloads import ProvisioningPolicy


class LogFormat(StrEnum):
    JSON = "json"
    TEXT = "text"


class Settings(KeySettings):
    """Everything the worker is configured with."""

    issuers: SecretStr | None = None
    """JSON list of the CAs to order from (secret: it holds EAB MAC keys), in order of preference (certflow.issuers);
    without it the ``ACME_*`` and ``CAA_ISSUER_DOMAIN`` settings make one issuer."""
    acme_directory_url: str | None = None
    acme_email: str | None = None
    acme_ca_bundle: Path | None = None
    acme_key_type: KeyType = KeyType.EC256
    acme_profile: str | None = None
    acme_dns_persist: bool = False
    """The CA offers dns-persist-01 (the single-CA form of the issuer's ``dns_persist``)."""

    cname_target: str
    edge_addresses: str = ""
    """Comma-separated IPv4/IPv6 addresses of the edge: a hostname (an apex) whose
    every A/AAAA address is one of them is routed without a CNAME."""
    caa_issuer_domain: str = "letsencrypt.org"
    dns_resolver: str
    managed_base_domain: str | None = None
    http01_listen: str = "0.0.0.0:80"
    log_format: LogFormat = LogFormat.JSON
    metrics_listen: str | None = None
    otlp_endpoint: str | None = None
    metrics_refresh_seconds: float = Field(default=120.0, gt=0)
    log_level: str = "INFO"

    # Provisioning policy, handed to workflows through an activity result so
    # that operators tune it here and histories replay unchanged.
    dns_recheck_initial_seconds: float = Field(default=60.0, gt=0)
    dns_recheck_max_seconds: float = Field(default=3600.0, gt=0)
    failure_backoff_initial_seconds: float = Field(default=900.0, gt=0)
    failure_backoff_max_seconds: float = Field(default=4 * 3600.0, gt=0)
    order_fast_poll_seconds: float = Field(default=8.0, gt=0)
    failed_retry_seconds: float = Field(default=86400.0, ge=0)
    reconcile_interval_seconds: float = Field(default=900.0, ge=0)
    events_retention_days: float = Field(default=400.0, ge=0)
    """How long certificate_events are kept (a hostname's newest always); 0 keeps all."""
    renewal_info_sweep_seconds: float = Field(default=3600.0, ge=0)
    """How often the renewal-info sweep asks the CA's ARI about due certificates; 0: never."""
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    expiring_soon_days: float = Field(default=7.0, gt=0)
    # Pacing toward the CA (docs/guarantees.md, "No order wasted": orders are not idempotent and limits are per account).
    max_new_orders_in_flight: int = Field(default=4, ge=1, le=64)
    acme_polls_per_second: float = Field(default=20.0, gt=0)
    # The HTTP-01 self-check before accept (off: the worker cannot reach its own edge).
    http01_self_check: bool = True
    http01_self_check_port: int = Field(default=80, ge=1, le=65535)
    http01_allow_reserved: str = ""
    """Comma-separated networks the self-check may connect to although they are
    reserved (loopback, private): a test rig's, as Boulder's allowRestrictedAddrs.
    Empty in production, where the CA never connects to them."""
    # Fallback to the next issuer CAA allows (certflow.issuers).
    issuer_fallback_cooldown_seconds: float = Field(default=3600.0, gt=0)
    """A rate-limit cooldown longer than this at the chosen CA sends the order elsewhere."""
    issuer_fallback_unreachable_seconds: float = Field(default=3600.0, gt=0)
    """So does the chosen CA being unreachable for longer than this."""
    pending_timeout_days: float = Field(default=14.0, ge=0)
    """A never-issued hostname with no validation method ready this long is CANCELED
    (ABANDONED); 0: never."""
    departed_retention_days: float = Field(default=30.0, ge=0)
    """An expired hostname no longer routed to us (DEPARTED) stops re-checking this
    long after it expired; 0: never."""
    require_ownership: bool = False
    """No order until the row's tenant proved ownership (``_certflow`` TXT); needs
    OWNERSHIP_SECRET. Off by default for existing deployments; recommended on."""
    # Delegated dns-01 (certflow.dns.dns01): the zone the customers' _acme-challenge
    # CNAMEs point into, its primary (RFC 2136 updates) and the TSIG key they are
    # signed with. All three, or none (then dns-01 is never ready).
    dns01_zone: str | None = None
    dns01_primary: str | None = None
    dns01_tsig_key: SecretStr | None = None
    """``name:algorithm:base64-secret`` (hmac-sha256/384/512)."""
    dns01_authoritative_port: int = Field(default=53, ge=1, le=65535)
    """The port the zone's name servers answer on (asked directly, TXT by TXT)."""

    @field_validator("cname_target")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("acme_directory_url")
    @classmethod
    def _https_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value:
            raise ValueError("must not be empty")
        if not value.startswith(("https://", "http://")):
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value

    @field_validator("acme_ca_bundle")
    @classmethod
    def _readable_bundle(cls, value: Path | None) -> Path | None:
        return readable_ca_bundle(value)

    @field_validator("issuers")
    @classmethod
    def _issuers(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        parse_issuers(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _one_way_to_name_the_ca(self) -> Settings:
        if self.issuers is None and self.acme_directory_url is None:
            raise ValueError(
                "acme_directory_url: is not set (or list the CAs in CERTFLOW_ISSUERS)"
            )
        if self.issuers is not None and self.acme_directory_url is not None:
            raise ValueError(
                "acme_directory_url: is set with CERTFLOW_ISSUERS; name the CAs in one of them"
            )
        return self

    @property
    def issuer_list(self) -> Issuers:
        """The CAs to order from, in order of preference."""
        if self.issuers is not None:
            return Issuers(items=parse_issuers(self.issuers.get_secret_value()))
        assert self.acme_directory_url is not None
        return Issuers(
            items=(
                Issuer(
                    name=DEFAULT_ISSUER,
                    directory_url=self.acme_directory_url,
                    caa_domains=(self.caa_issuer_domain,),
                    ca_bundle=self.acme_ca_bundle,
                    profile=self.acme_profile,
                    dns_persist=self.acme_dns_persist,
                ),
            )
        )

    @field_validator("dns_resolver", "http01_listen", "metrics_listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parse_host_port(value)
        return value.strip()

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not value.startswith(("https://", "http://")):
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value.strip()

    @field_validator("dns01_zone")
    @classmethod
    def _dns01_zone(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            return normalize_hostname(value)
        except InvalidHostnameError as err:
            raise ValueError(err.reason) from None

    @field_validator("dns01_primary")
    @classmethod
    def _dns01_primary(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parse_host_port(value)
        return value.strip()

    @field_validator("dns01_tsig_key")
    @classmethod
    def _tsig(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        TsigKey.parse(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _ownership_needs_a_secret(self) -> Settings:
        if self.require_ownership and self.ownership_secret is None:
            raise ValueError("ownership_secret: is not set (required with CERTFLOW_REQUIRE_OWNERSHIP)")
        return self

    @model_validator(mode="after")
    def _dns01_all_or_none(self) -> Settings:
        given = {
            "dns01_zone": self.dns01_zone,
            "dns01_primary": self.dns01_primary,
            "dns01_tsig_key": self.dns01_tsig_key,
        }
        missing = [name for name, value in given.items() if value is None]
        if missing and len(missing) < len(given):
            raise ValueError(f"{missing[0]}: is not set (dns-01 needs CERTFLOW_DNS01_ZONE, _PRIMARY and _TSIG_KEY)")
        return self

    @property
    def dns01(self) -> Dns01Zone | None:
        """Delegated dns-01's zone, when configured."""
        if self.dns01_zone is None or self.dns01_primary is None or self.dns01_tsig_key is None:
            return None
        return Dns01Zone(
            zone=self.dns01_zone,
            primary=self.dns01_primary,
            key=TsigKey.parse(self.dns01_tsig_key.get_secret_value()),
            authoritative_port=self.dns01_authoritative_port,
        )

    @model_validator(mode="after")
    def _webhook_secret_with_url(self) -> Settings:
        if self.webhook_url and not (self.webhook_secret and self.webhook_secret.get_secret_value()):
            raise ValueError("webhook_secret: is not set (required with CERTFLOW_WEBHOOK_URL)")
        return self

    @field_validator("edge_addresses")
    @classmethod
    def _addresses(cls, value: str) -> str:
        for item in value.split(","):
            if item.strip():
                try:
                    ipaddress.ip_address(item.strip())
                except ValueError:
                    raise ValueError(f"expected comma-separated IP addresses, got {item.strip()!r}") from None
        return value.strip()

    @property
    def edge_address_set(self) -> frozenset[str]:
        return frozenset(str(ipaddress.ip_address(a.strip())) for a in self.edge_addresses.split(",") if a.strip())

    @field_validator("http01_allow_reserved")
    @classmethod
    def _networks(cls, value: str) -> str:
        try:
            AddressPolicy.allowing(value.split(","))
        except ValueError as err:
            raise ValueError(f"expected comma-separated networks (127.0.0.0/8,::1/128): {err}") from None
        return value.strip()

    @property
    def http01_address_policy(self) -> AddressPolicy:
        """Which addresses the self-check connects to, as the CA would."""
        return AddressPolicy.allowing(self.http01_allow_reserved.split(","))

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError(f"must be DEBUG, INFO, WARNING or ERROR, got {value!r}")
        return value.upper()

    @field_validator("cname_target", "caa_issuer_domain", "managed_base_domain")
    @classmethod
    def _domain(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return value.strip().lower().rstrip(".")

    def provisioning_policy(self) -> ProvisioningPolicy:
        return ProvisioningPolicy(
            dns_recheck_initial_seconds=self.dns_recheck_initial_seconds,
            dns_recheck_max_seconds=self.dns_recheck_max_seconds,
            failure_backoff_initial_seconds=self.failure_backoff_initial_seconds,
            failure_backoff_max_seconds=self.failure_backoff_max_seconds,
            order_fast_poll_seconds=self.order_fast_poll_seconds,
            failed_retry_seconds=self.failed_retry_seconds,
            webhooks=self.webhook_url is not None,
            expiring_soon_days=self.expiring_soon_days,
            http01_self_check=self.http01_self_check,
            issuers=self.issuer_list.names,
            issuer_fallback_cooldown_seconds=self.issuer_fallback_cooldown_seconds,
            issuer_fallback_unreachable_seconds=self.issuer_fallback_unreachable_seconds,
            pending_timeout_days=self.pending_timeout_days,
            departed_retention_days=self.departed_retention_days,
            hostname_search_attribute=self.hostname_search_attribute,
        )


    @property
    def dns_resolver_address(self) -> tuple[str, int]:
        return parse_host_port(self.dns_resolver)

    @property
    def http01_address(self) -> tuple[str, int]:
        return parse_host_port(self.http01_listen, default_host="0.0.0.0")
