"""``certflow edge``'s settings (``CERTFLOW_EDGE_*``, docs/settings.md): which edge
it keeps current and how it reaches it, on top of the database and the key it
decrypts with."""

from __future__ import annotations

import socket

from pydantic import SecretStr, field_validator, model_validator

from certflow.hostnames import parse_host_port
from certflow.connect.settings import KeySettings


class EdgeSettings(KeySettings):
    """``certflow edge``: keeps one edge holding exactly the current certificates
    (certflow/edge/maintain.py); it decrypts keys, so it reads KeySettings too."""

    edge_kind: str = "files"
    """EDGE_KIND: which edge this process keeps current: ``files`` (a directory of
    ``<hostname>.pem``, for nginx and any edge that reads files), ``haproxy`` (its
    runtime API) or ``caddy`` (an endpoint for its ``get_certificate http``)."""
    edge_dir: str = "/run/certflow-edge"
    """EDGE_DIR: the files kind's directory (a tmpfs: keys never reach a disk)."""
    edge_owner: str | None = None
    """EDGE_OWNER: the user (``name``, ``uid`` or ``uid:gid``) that owns the files,
    the edge's worker user (nginx: ``www-data``); unset, this process's own."""
    edge_poll_seconds: float = 0.5
    """EDGE_POLL_SECONDS: how often the change feed is read (an index range scan of
    the recent transactions' events: two a second cost Postgres next to nothing)."""
    edge_haproxy_socket: str = "/run/haproxy/admin.sock"
    """EDGE_HAPROXY_SOCKET: HAProxy's runtime API (``stats socket … level admin``):
    a unix socket path, or ``host:port``."""
    edge_haproxy_crt_list: str = "/etc/haproxy/certflow.crtlist"
    """EDGE_HAPROXY_CRT_LIST: the crt-list named on HAProxy's ``bind … crt-list``
    line, as written there; certflow adds and removes its entries in memory."""
    edge_name: str | None = None
    """EDGE_NAME: this edge's name in ``status`` and the metrics; unset,
    ``<this machine's hostname>-<kind>``."""
    edge_address: str | None = None
    """EDGE_ADDRESS: where the edge serves TLS (``host:port``, reachable from where
    ``status`` runs): ``status HOST`` makes a handshake there to read the serial it
    serves. Unset, ``status`` reports when the edge was last current instead."""
    edge_metrics_listen: str | None = None
    """EDGE_METRICS_LISTEN: ``host:port`` for Prometheus metrics; unset, none."""
    edge_listen: str = "127.0.0.1:8404"
    """EDGE_LISTEN: where the caddy kind answers Caddy's ``get_certificate http``."""
    edge_secret: SecretStr | None = None
    """EDGE_SECRET: what a caller of the caddy kind's endpoint must present (the
    password of the URL Caddy calls, or a bearer token); at least 16 characters."""

    @field_validator("edge_kind")
    @classmethod
    def _edge_kind(cls, value: str) -> str:
        value = value.strip().lower()
        if value not in EDGE_KINDS:
            raise ValueError(f"must be one of {', '.join(EDGE_KINDS)}")
        return value

    @field_validator("edge_owner")
    @classmethod
    def _edge_owner(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        resolve_owner(value)
        return value.strip()

    @field_validator("edge_poll_seconds")
    @classmethod
    def _edge_poll(cls, value: float) -> float:
        if not 0 < value <= 300:
            raise ValueError("must be more than 0 and at most 300")
        return value

    @field_validator("edge_haproxy_socket", "edge_haproxy_crt_list")
    @classmethod
    def _edge_haproxy(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("edge_listen")
    @classmethod
    def _edge_listen(cls, value: str) -> str:
        parse_host_port(value)
        return value.strip()

    @field_validator("edge_address", "edge_metrics_listen")
    @classmethod
    def _edge_host_port(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parse_host_port(value)
        return value.strip()

    @field_validator("edge_name")
    @classmethod
    def _edge_name(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if len(value.strip()) > 100 or not value.strip().isprintable():
            raise ValueError("must be at most 100 printable characters")
        return value.strip()

    @property
    def edge_display_name(self) -> str:
        return self.edge_name or f"{socket.gethostname()}-{self.edge_kind}"

    @field_validator("edge_secret")
    @classmethod
    def _edge_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        if len(value.get_secret_value().strip()) < 16:
            raise ValueError("must be at least 16 characters")
        return SecretStr(value.get_secret_value().strip())

    @model_validator(mode="after")
    def _caddy_needs_a_secret(self) -> EdgeSettings:
        if self.edge_kind == "caddy" and self.edge_secret is None:
            raise ValueError(
                "CERTFLOW_EDGE_SECRET is required for the caddy kind: its endpoint hands out private keys"
            )
        return self

    @property
    def edge_owner_ids(self) -> tuple[int, int] | None:
        return None if self.edge_owner is None else resolve_owner(self.edge_owner)


EDGE_KINDS = ("files", "haproxy", "caddy")


def resolve_owner(value: str) -> tuple[int, int]:
    """``name``, ``uid`` or ``uid:gid`` (or ``name:group``) as (uid, gid); a name's
    gid is its primary group."""
    import grp
    import pwd

    user, _, group = value.strip().partition(":")
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        if not user.isdigit():
            raise ValueError(f"no such user {user!r}") from None
        if not group:
            raise ValueError(f"uid {user} has no passwd entry: give uid:gid") from None
        uid, gid = int(user), -1
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"no such group {group!r}") from None
    return uid, gid
