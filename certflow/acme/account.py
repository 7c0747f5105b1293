"""The ACME account at each CA and the clients that act for it.

certbot's ``acme`` library is blocking and its clients are not thread-safe, so
each activity call borrows a client of its own from :class:`AcmeClients` and
runs the blocking calls in a thread.
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import logging
import queue
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Awaitable, Callable
from typing import Any, Iterator
from contextlib import contextmanager

import asyncpg
from josepy.b64 import b64encode
from josepy.jwa import ES256
from josepy.jwk import JWKEC
from acme import client as acme_client
from acme import errors as acme_errors
from acme import messages
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certflow.acme.network import USER_AGENT, AcmeNetwork, classify_acme_failure
from certflow.store import accounts
from certflow.crypto import EncryptionKey
from certflow.errors import AcmeProblemError, CaUnreachableError, ConfigError, ErrorCode
from certflow.issuers import ExternalAccountBinding, Issuer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AcmeAccount:
    """The registered account every client of this process signs with."""

    directory_url: str
    account_url: str
    key: JWKEC
    directory_json: dict[str, Any]
    verify: str | bool
    replaces_refused_until: datetime | None = None
    """While in the future, the CA rejects RFC 9773 ``replaces`` (renewals go without it)."""


def _account_network(key: JWKEC, verify: str | bool) -> AcmeNetwork:
    # requests accepts a CA bundle path where acme's signature says bool.
    return AcmeNetwork(key, alg=ES256, verify_ssl=verify, user_agent=USER_AGENT, timeout=15)  # type: ignore[arg-type]


def external_account_binding(
    key: JWKEC, eab: ExternalAccountBinding, directory: messages.Directory
) -> dict[str, Any]:
    """The RFC 8555 §7.3.4 JWS binding the account key to the CA's key id: the
    account's public JWK as payload, MACed (HS256) with the CA's key, ``kid`` and
    the newAccount URL in the protected header."""
    return messages.ExternalAccountBinding.from_data(
        account_public_key=key.public_key(),
        kid=eab.kid,
        hmac_key=eab.hmac_key.get_secret_value(),
        directory=directory,
    )


def _register(
    directory_url: str,
    key: JWKEC,
    email: str | None,
    verify: str | bool,
    eab: ExternalAccountBinding | None = None,
) -> tuple[str, dict[str, Any]]:
    """Register the key (or find its existing account); returns URL and directory JSON."""
    net = _account_network(key, verify)
    directory_json = net.get(directory_url).json()
    directory = messages.Directory.from_json(copy.deepcopy(directory_json))
    client = acme_client.ClientV2(directory, net)
    binding = external_account_binding(key, eab, directory) if eab is not None else None
    registration = messages.NewRegistration.from_data(
        email=email, terms_of_service_agreed=True, external_account_binding=binding
    )
    try:
        regr = client.new_account(registration)
        return str(regr.uri), directory_json
    except acme_errors.ConflictError as conflict:
        return str(conflict.location), directory_json


REGISTER_ATTEMPTS = 6


async def _register_with_retries(
    issuer: Issuer, key: JWKEC, email: str | None, setting: str, attempts: int
) -> tuple[str, dict[str, Any]]:
    """Register, riding out short CA faults (badNonce, 5xx, resets) with backoff;
    anything else (a refused External Account Binding) is a ConfigError, a fault
    that persists a CaUnreachableError, each one clear line naming ``setting``."""
    for attempt in range(1, attempts + 1):
        try:
            return await asyncio.to_thread(
                _register, issuer.directory_url, key, email, issuer.verify, issuer.eab
            )
        except Exception as exc:  # classified below
            failure = classify_acme_failure(exc)
            temporary = failure.code is ErrorCode.ACME_TEMPORARY
            if not temporary or attempt == attempts:
                binding = " with its External Account Binding" if issuer.eab else ""
                raise (CaUnreachableError if temporary else ConfigError)(
                    f"{setting}: cannot register the ACME account{binding} at"
                    f" {issuer.directory_url}: {failure.detail}"
                ) from None
            delay = min(2.0 ** (attempt - 1) * 0.5, 8.0)
            log.warning("ACME account registration failed (%s); retrying in %.1f s", failure.detail, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def issuer_setting(issuer: Issuer, listed: bool) -> str:
    """The setting an operator fixes for this issuer, as errors name it: its item of
    ``CERTFLOW_ISSUERS`` when ``listed``, else the single CA's directory URL."""
    return f"CERTFLOW_ISSUERS ({issuer.name})" if listed else "CERTFLOW_ACME_DIRECTORY_URL"


async def ensure_account(
    pool: asyncpg.Pool,
    issuer: Issuer,
    email: str | None,
    encryption_key: EncryptionKey,
    setting: str = "CERTFLOW_ACME_DIRECTORY_URL",
    attempts: int = REGISTER_ATTEMPTS,
) -> AcmeAccount:
    """Load this issuer's account key (generating and storing it, encrypted, the
    first time) and make sure the CA knows it, registered with the issuer's External
    Account Binding when it has one. Safe when workers start together.

    A refused registration, or a profile the CA's directory does not list, is a
    ConfigError naming ``setting``, raised before anything is written."""
    directory_url, verify, profile = issuer.directory_url, issuer.verify, issuer.profile

    async with pool.acquire() as conn:
        async with conn.transaction():
            await accounts.lock_directory(conn, directory_url)
            stored = await accounts.stored_account(conn, directory_url)
            if stored is not None:
                pem = encryption_key.decrypt(stored.encrypted_key)
                private = serialization.load_pem_private_key(pem, password=None)
            else:
                private = ec.generate_private_key(ec.SECP256R1())
                pem = private.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            key = JWKEC(key=private)
            # Registering an existing key only returns its URL, so this also
            # re-registers after the CA lost the account (a restarted Pebble).
            account_url, directory_json = await _register_with_retries(
                issuer, key, email, setting, attempts
            )
            check_profile(directory_json, profile, setting)
            if stored is None or stored.account_url != account_url:
                await accounts.save_account(
                    conn, directory_url, account_url, encryption_key.encrypt(pem)
                )
    log.info("ACME account ready", extra={"account_url": account_url, "issuer": issuer.name})
    refused_until = stored.replaces_refused_until if stored is not None else None
    return AcmeAccount(directory_url, account_url, key, directory_json, verify, refused_until)


def check_profile(
    directory_json: dict[str, Any], profile: str | None, setting: str = "CERTFLOW_ACME_DIRECTORY_URL"
) -> None:
    """A configured ACME profile must be one the CA's directory lists."""
    if not profile:
        return
    offered = dict(directory_json.get("meta", {}).get("profiles") or {})
    if profile not in offered:
        listed = ", ".join(sorted(offered)) or "none"
        where = "CERTFLOW_ACME_PROFILE" if setting == "CERTFLOW_ACME_DIRECTORY_URL" else setting
        raise ConfigError(
            f"{where}: the CA does not offer profile {profile!r} (it offers: {listed})"
        )


REGISTER_AGAIN_SECONDS = 60.0


class AcmeClients:
    """A pool of ready clients for one issuer's account; each borrower has one to itself.

    Without an account (the CA did not answer at start-up), ``register`` is tried
    again by :meth:`ready`, at most once a minute; until it succeeds every call to
    this issuer fails as the CA unreachable (so certificates fall back elsewhere).
    """

    def __init__(
        self,
        account: AcmeAccount | None,
        issuer: Issuer,
        register: Callable[[], Awaitable[AcmeAccount]] | None = None,
    ) -> None:
        self._account = account
        self.issuer = issuer
        self._register = register
        self._register_after = 0.0
        self._registering: asyncio.Lock | None = None
        self.replaces_refused_until = account.replaces_refused_until if account else None
        """While in the future, the CA rejects RFC 9773 ``replaces`` (renewals go
        without it); asked again after it."""
        self._idle: queue.SimpleQueue[acme_client.ClientV2] = queue.SimpleQueue()

    @property
    def account(self) -> AcmeAccount:
        if self._account is None:
            raise self._unregistered("its CA did not answer when the worker started")
        return self._account

    @property
    def account_url(self) -> str | None:
        return self._account.account_url if self._account else None

    @property
    def takes_replaces(self) -> bool:
        """Whether renewals name the certificate they replace (RFC 9773 §5) now."""
        until = self.replaces_refused_until
        return until is None or until <= datetime.now(timezone.utc)

    async def ready(self) -> None:
        """Make sure the account is registered (see the class docstring)."""
        if self._account is not None:
            return
        if self._registering is None:
            self._registering = asyncio.Lock()
        async with self._registering:
            if self._account is not None:
                return
            if self._register is None or time.monotonic() < self._register_after:
                raise self._unregistered("its CA did not answer; asking again within a minute")
            self._register_after = time.monotonic() + REGISTER_AGAIN_SECONDS
            try:
                account = await self._register()
            except ConfigError as err:
                raise self._unregistered(str(err)) from None
            self.replaces_refused_until = account.replaces_refused_until
            self._account = account
            log.info("ACME account registered on first use", extra={"issuer": self.issuer.name})

    def _unregistered(self, why: str) -> AcmeProblemError:
        return AcmeProblemError(
            code=ErrorCode.ACME_TEMPORARY,
            message=f"no ACME account at {self.issuer.name} yet: {why}",
            unreachable=True,
        )

    def _new_client(self) -> acme_client.ClientV2:
        net = _account_network(self.account.key, self.account.verify)
        net.account = messages.RegistrationResource(
            body=messages.Registration(), uri=self.account.account_url
        )
        directory = messages.Directory.from_json(copy.deepcopy(self.account.directory_json))
        return acme_client.ClientV2(directory, net)

    @contextmanager
    def borrow(self) -> Iterator[acme_client.ClientV2]:
        try:
            client = self._idle.get_nowait()
        except queue.Empty:
            client = self._new_client()
        try:
            yield client
        except BaseException:
            # A failed exchange may leave stale nonces or a broken session behind.
            client.net.session.close()
            raise
        else:
            self._idle.put(client)

    @property
    def new_nonce_url(self) -> str:
        return str(self.account.directory_json["newNonce"])

    def key_authorization(self, token: str) -> str:
        thumbprint = b64encode(self.account.key.thumbprint()).decode()
        return f"{token}.{thumbprint}"
