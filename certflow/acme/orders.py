"""One CA's orders, from new-order to the stored certificate (``IssuerOrders``),
and the configured CAs they belong to (``Issuers``).

The blocking ``acme`` calls run on a thread; the waiting, heartbeats and
Postgres writes stay on the event loop. A new private key is generated,
encrypted and bound to the order in Postgres before finalize, and never leaves
this module (SPEC §5). The Temporal activities that call these are in
activities/acme.py.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from datetime import datetime, timezone
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
from acme import challenges, messages
from acme import client as acme_client
from acme.client import _renewal_info_path_component  # acme's RFC 9773 certificate id
from cryptography import x509
from josepy import json_util
from temporalio import activity

from certflow.acme.client import (
    DEFAULT_RATE_LIMIT_SECONDS,
    AcmeClients,
    classify_acme_failure,
    parse_retry_after,
)
from certflow.acme.problems import challenge_failure
from certflow.acme.rate_limits import UNKNOWN_LIMIT
from certflow.acme.refusals import ReplacesRefusal, problem_suffix, replaces_refusal
from certflow.acme.pacing import PollPacer
from certflow.acme.ari import fetch_renewal_info, next_check, renewal_info_url
from certflow.store import accounts, certificates, cooldowns
from certflow.store import attempts, issued
from certflow.hostnames import registered_domain
from certflow.acme.slots import NoOrderSlotError, order_slot
from certflow.crypto import (
    CertificateInfo,
    DecryptionError,
    EncryptionKey,
    certificate_info,
    generate_private_key,
    load_private_key,
    make_csr,
    private_key_to_pem,
    public_key_matches,
    split_fullchain,
)
from certflow.errors import AcmeProblemError, ProvisioningError, ErrorCode
from certflow.metrics import CertflowMetrics
from certflow.models import Cooldown, LimitScope, OrderKind, ISSUABLE, AcmeStatus, ValidationMethod
from certflow.activity_payloads import (
    FinalizeInput,
    IssuedCertificate,
    OpenedOrder,
    OrderProgress,
    PlaceOrderInput,
    RenewalAdvice,
    WaitForOrderInput,
)
from certflow.worker_settings import KeyType

T = TypeVar("T")

FAST_POLL_FIRST = 0.02
FAST_POLL_MAX = 0.25
FINALIZE_WAIT = 30.0
FIRST_RENEWAL_INFO_TIMEOUT = 5.0  # inside finalize's 10 s heartbeat timeout
AUTHZ_FETCH_BUDGET = 8.0  # of create_order's 20 s
MAX_RETRY_AFTER_SECONDS = 7 * 86400.0  # SPEC §4: a longer Retry-After is capped
ORDER_SLOT_WAIT = 10.0  # of place_order's 20 s
BUSY_SLOTS_RETRY_SECONDS = 5.0
PAUSED_RECHECK_SECONDS = 86400.0
REPLACES_FAILING_FOR_SECONDS = 3600.0


@dataclass(frozen=True)
class OrderPacing:
    """How hard this worker pushes the CA (settings ``MAX_NEW_ORDERS_IN_FLIGHT``,
    ``ACME_POLLS_PER_SECOND``)."""

    max_orders_in_flight: int = 4
    """New-order requests in flight at once for the account, across every worker."""
    polls_per_second: float = 20.0
    """Order and authorization polls of this worker, all certificates together."""


class RenewalOrder(messages.NewOrder):
    """A new order that may name the certificate it replaces (RFC 9773 §5)."""

    replaces: str | None = json_util.field("replaces", omitempty=True)


def _scope_key(scope: LimitScope, hostname: str) -> str:
    if scope is LimitScope.HOSTNAME:
        return hostname
    if scope is LimitScope.REGISTERED_DOMAIN:
        return registered_domain(hostname)
    return ""


def _issued(info: CertificateInfo, window: RenewalAdvice) -> IssuedCertificate:
    return IssuedCertificate(
        serial_hex=info.serial_hex,
        not_before=info.not_before,
        not_after=info.not_after,
        ari_window_start=window.window_start,
        ari_window_end=window.window_end,
        issued_at=datetime.now(timezone.utc),
    )


@dataclass(frozen=True)
class _Fetched:
    body: dict[str, Any]
    retry_after: float | None


def _order_status(order: dict[str, Any]) -> AcmeStatus:
    try:
        return AcmeStatus(str(order.get("status")))
    except ValueError:
        raise AcmeProblemError(
            code=ErrorCode.ACME_TEMPORARY,
            message=f"the CA answered an order status RFC 8555 does not define: {order.get('status')!r}",
        ) from None


class IssuerOrders:
    """What the ACME activities do at one issuer (CA), with its account: its
    cooldowns, order slots, profile and ARI. :class:`AcmeActivities` picks the
    issuer of each call."""

    def __init__(
        self,
        clients: AcmeClients,
        pool: asyncpg.Pool,
        encryption_key: EncryptionKey,
        key_type: KeyType,
        executor: ThreadPoolExecutor,
        metrics: CertflowMetrics,
        pacing: OrderPacing,
        polls: PollPacer,
    ) -> None:
        self._clients = clients
        self._pool = pool
        self._key = encryption_key
        self._key_type = key_type
        self._executor = executor
        self._profile = clients.issuer.profile
        self._metrics = metrics
        self._pacing = pacing
        self._polls = polls

    @property
    def name(self) -> str:
        return self._clients.issuer.name

    @property
    def _directory_url(self) -> str:
        return self._clients.issuer.directory_url

    @property
    def order_origin(self) -> tuple[str, str] | None:
        """Where this CA's orders live (scheme, host:port of its newOrder URL);
        None until its account is registered."""
        if self._clients.account_url is None:
            return None
        split = urllib.parse.urlsplit(str(self._clients.account.directory_json.get("newOrder", "")))
        return (split.scheme, split.netloc)

    async def ready(self) -> None:
        """Its account registered (a CA that did not answer at start-up is asked now)."""
        await self._clients.ready()

    async def _call(
        self,
        fn: Callable[[acme_client.ClientV2], T],
        *,
        hostname: str | None = None,
        poll: bool = False,
    ) -> T:
        """Run one blocking exchange with a borrowed client; CA failures become typed
        errors, a rate limit recorded as the cooldown of its scope (for ``hostname``,
        when the exchange concerns one). ``poll``: the exchange reads an existing
        order or authorization, and a 503 with Retry-After backs off that order
        alone — it sets no cooldown for new orders."""

        def run() -> T:
            with self._clients.borrow() as client:
                return fn(client)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, run)
        except ProvisioningError:
            raise
        except Exception as exc:
            raise await self._typed(classify_acme_failure(exc), hostname, poll) from None

    async def _typed(
        self, err: AcmeProblemError, hostname: str | None = None, poll: bool = False
    ) -> AcmeProblemError:
        """Count the CA error; cap an absurd Retry-After; record a rate limit as the
        cooldown of the scope the CA's limit applies to (SPEC §4)."""
        self._metrics.acme_error(err.problem_type)
        if err.code is not ErrorCode.ACME_RATE_LIMITED:
            return err
        seconds = err.retry_after_seconds
        if seconds is None:
            # A paused hostname does not come back by waiting (only the CA's portal
            # lifts it): look again a day later, not every hour.
            seconds = PAUSED_RECHECK_SECONDS if err.paused else DEFAULT_RATE_LIMIT_SECONDS
        if seconds > MAX_RETRY_AFTER_SECONDS:
            activity.logger.warning(
                "the CA asked to wait %.0f s; waiting the 7-day cap instead",
                seconds,
                extra={"detail": err.detail, "problem_type": err.problem_type},
            )
            seconds = MAX_RETRY_AFTER_SECONDS
        err.retry_after_seconds = seconds
        scope = LimitScope(err.limit_scope or LimitScope.ACCOUNT)
        if poll and err.http_status == 503:
            return err  # the overall request rate, read on this order: back off it alone
        if scope is not LimitScope.ACCOUNT and hostname is None:
            return err  # no key for the scope: the order waits, nothing else is held
        if seconds > 0:
            until = await cooldowns.extend_cooldown(
                self._pool,
                self._directory_url,
                scope,
                _scope_key(scope, hostname or ""),
                err.limit_name or UNKNOWN_LIMIT,
                seconds,
                err.problem_type,
                err.detail,
            )
            err.retry_after_seconds = max(0.0, until.timestamp() - time.time())
            self._metrics.cooldown(until)
        return err

    def _post_as_get(self, client: acme_client.ClientV2, url: str) -> _Fetched:
        response = client.net.post(url, None, new_nonce_url=self._clients.new_nonce_url)
        return _Fetched(response.json(), parse_retry_after(response.headers.get("Retry-After")))

    async def cooldown_left(self, hostname: str, kind: OrderKind) -> float:
        """Seconds left of this issuer's rate-limit cooldowns that hold back an order
        of this kind for hostname (0 when none)."""
        held = cooldowns.longest(await self._cooldowns_for(hostname, kind))
        return max(0.0, held.until.timestamp() - time.time()) if held else 0.0

    async def _cooldowns_for(self, hostname: str, kind: OrderKind) -> list[Cooldown]:
        return await cooldowns.applicable_cooldowns(
            self._pool, self._directory_url, hostname, registered_domain(hostname), kind
        )

    # -- create_order ------------------------------------------------------

    async def new_order(
        self,
        hostname: str,
        kind: OrderKind = OrderKind.NEW,
        certificate_id: str | None = None,
        methods: Sequence[ValidationMethod] = (),
    ) -> OpenedOrder:
        """Send new-order, unless a cooldown in a scope that applies holds this kind of
        order back; at most ``max_orders_in_flight`` at a time for the account. A
        renewal names the certificate it replaces (RFC 9773 §5) when the CA takes
        it; refused, it is sent once more without."""
        await self._raise_if_held(hostname, kind)
        replaces = None
        if kind is not OrderKind.NEW and certificate_id is not None:
            replaces = await self._replaces(certificate_id)
        try:
            async with order_slot(
                self._pool,
                self._directory_url,
                self._pacing.max_orders_in_flight,
                timeout=ORDER_SLOT_WAIT,
            ):
                # A refusal may have come while this order waited for its slot.
                await self._raise_if_held(hostname, kind)
                return await self._send_new_order(hostname, replaces, certificate_id, methods)
        except NoOrderSlotError as err:
            raise AcmeProblemError(
                code=ErrorCode.ACME_RATE_LIMITED,
                message=f"waiting for a new-order slot of the account: {err}",
                retry_after_seconds=BUSY_SLOTS_RETRY_SECONDS,
            ) from None

    async def _raise_if_held(self, hostname: str, kind: OrderKind) -> None:
        """ACME_RATE_LIMITED when a cooldown in a scope that applies holds this kind of
        order back: nothing is sent into a bucket known to be empty."""
        held = cooldowns.longest(await self._cooldowns_for(hostname, kind))
        if held is None:
            return
        remaining = max(0.0, held.until.timestamp() - time.time())
        where = "this account" if held.scope is LimitScope.ACCOUNT else f"{held.scope_key}"
        raise AcmeProblemError(
            code=ErrorCode.ACME_RATE_LIMITED,
            message=(
                f"the CA is rate-limiting new orders for {where} until"
                f" {held.until.isoformat()}: {held.detail or held.limit_name}"
            ),
            problem_type=held.problem_type or "",
            detail=held.detail or "",
            retry_after_seconds=remaining,
            limit_scope=str(held.scope),
            limit_name=held.limit_name,
        )

    async def _send_new_order(
        self,
        hostname: str,
        replaces: str | None,
        certificate_id: str | None,
        methods: Sequence[ValidationMethod] = (),
    ) -> OpenedOrder:
        try:
            return await self._call(
                lambda client: self._open_order(client, hostname, replaces, methods),
                hostname=hostname,
            )
        except AcmeProblemError as err:
            if replaces is None:
                raise
            refusal = replaces_refusal(err.problem_type, err.detail, err.http_status)
            if refusal is None:
                raise
            malformed = problem_suffix(err.problem_type) == "malformed"
            if refusal is ReplacesRefusal.TEMPORARY:
                if certificate_id is not None:
                    await attempts.note_replaces_failing(self._pool, certificate_id)
                raise AcmeProblemError(
                    code=ErrorCode.ACME_TEMPORARY,
                    message=f"the CA could not check `replaces` (retrying with it later): {err.detail}",
                    problem_type=err.problem_type,
                    detail=err.detail,
                    http_status=err.http_status,
                ) from None
            activity.logger.warning(
                "the CA refused `replaces` (%s); ordering once without it",
                refusal,
                extra={"detail": err.detail, "problem_type": err.problem_type},
            )
        order = await self._call(
            lambda client: self._open_order(client, hostname, None, methods), hostname=hostname
        )
        if refusal is ReplacesRefusal.FIELD and malformed:
            # Our certID is well-formed and the order went through without it: this
            # CA rejects the field. Renewals go without it for a day, then ask again.
            self._clients.replaces_refused_until = await accounts.refuse_replaces(
                self._pool, self._directory_url
            )
        return order

    async def _replaces(self, certificate_id: str) -> str | None:
        """The RFC 9773 certID of the certificate a renewal replaces, when the CA has
        ARI and takes ``replaces`` now — unless the CA has failed to check it for
        this certificate for over REPLACES_FAILING_FOR_SECONDS (a 5xx each time): no
        refusal blocks a renewal."""
        if not self._clients.takes_replaces or not self._clients.account.directory_json.get("renewalInfo"):
            return None
        current = await attempts.replaced_certificate(self._pool, certificate_id)
        if current is None:
            return None
        if current.failing_for_seconds > REPLACES_FAILING_FOR_SECONDS:
            activity.logger.warning(
                "the CA has failed to check `replaces` for %.0f s; renewing without it",
                current.failing_for_seconds,
            )
            return None
        return str(
            _renewal_info_path_component(x509.load_pem_x509_certificate(current.leaf_pem.encode()))
        )

    def _open_order(
        self,
        client: acme_client.ClientV2,
        hostname: str,
        replaces: str | None,
        methods: Sequence[ValidationMethod] = (),
    ) -> OpenedOrder:
        new_order = RenewalOrder(
            identifiers=[messages.Identifier(typ=messages.IDENTIFIER_FQDN, value=hostname)],
            profile=self._profile or None,
            replaces=replaces,
        )
        response = client.net.post(
            client.directory["newOrder"], new_order, new_nonce_url=self._clients.new_nonce_url
        )
        order = messages.Order.from_json(response.json())
        order_url = response.headers["Location"]
        authorization_url = order.authorizations[0]
        authz = self._fetch_authorization(client, authorization_url)
        # An unknown type (dns-persist-01 to acme 5.9) is an UnrecognizedChallenge,
        # whose class has no ``typ``: the type is in its JSON.
        offered = {str(challb.to_partial_json().get("type")): challb for challb in authz.challenges}
        wanted = list(methods) or [ValidationMethod.HTTP_01]
        for method in wanted:
            challb = offered.get(str(method))
            if challb is None:
                continue
            token = challb.chall.encode("token") if hasattr(challb.chall, "token") else ""
            return OpenedOrder(
                order_url=order_url,
                authorization_url=authorization_url,
                challenge_url=challb.uri,
                token=token,
                key_authorization=self._clients.key_authorization(token) if token else "",
                replaces=replaces,
                method=None if method is ValidationMethod.HTTP_01 and not methods else method,
            )
        names = ", ".join(str(m) for m in wanted)
        raise AcmeProblemError(
            code=ErrorCode.ACME_REJECTED,
            message=f"the CA {self.name} offers no {names} challenge for {hostname}"
            f" (it offers {', '.join(sorted(offered)) or 'none'})",
        )

    def _fetch_authorization(
        self, client: acme_client.ClientV2, authorization_url: str
    ) -> messages.Authorization:
        """The CA created the order when new-order answered, and orders are not
        idempotent (SPEC §7): a short fault fetching its authorization is retried
        here, because a retry of the whole activity would open a second order."""
        deadline = time.monotonic() + AUTHZ_FETCH_BUDGET
        delay = FAST_POLL_MAX
        while True:
            try:
                authorization: messages.Authorization = messages.Authorization.from_json(
                    self._post_as_get(client, authorization_url).body
                )
                return authorization
            except Exception as exc:
                err = classify_acme_failure(exc)
                wait = max(delay, err.retry_after_seconds or 0.0)
                if err.code is ErrorCode.ACME_INVALID_ORDER or time.monotonic() + wait > deadline:
                    raise
            time.sleep(wait)  # on the executor thread, like the exchange itself
            delay = min(delay * 2, 2.0)

    # -- place_order -------------------------------------------------------

    async def place(self, input: PlaceOrderInput) -> OpenedOrder:
        # Only a retry can find an order of its own on the row (the workflow calls this
        # when the row had none), so a first try spends no read on it.
        if activity.info().attempt > 1:
            stored = await certificates.stored_open_order(self._pool, input.certificate_id)
            if stored is not None:
                return stored
        if input.issuer is not None:
            await attempts.choose_issuer(
                self._pool, input.certificate_id, self.name, input.issuer_reason
            )
        order = await self.new_order(input.hostname, input.kind, input.certificate_id, input.methods)
        # Committed before anything asks the CA to validate, so the responder can
        # answer its first request.
        reason = input.method_reason
        if reason is not None and input.methods and order.method is not input.methods[0]:
            reason = f"{order.method}: the CA {self.name} offers no {input.methods[0]} challenge"
        if not await certificates.persist_challenge(self._pool, input.certificate_id, order, reason):
            raise ProvisioningError(
                code=ErrorCode.ACME_INVALID_ORDER, message="the certificate row moved on"
            )
        return order

    # -- accept_challenge --------------------------------------------------

    async def accept(self, challenge_url: str) -> None:
        await self._call(lambda client: self._accept(client, challenge_url))

    def _accept(self, client: acme_client.ClientV2, challenge_url: str) -> None:
        try:
            client.net.post(
                challenge_url,
                challenges.HTTP01Response(),
                new_nonce_url=self._clients.new_nonce_url,
            )
        except messages.Error:
            # Pebble answers `malformed` to a second accept; only the status tells.
            challenge = self._post_as_get(client, challenge_url).body
            if challenge.get("status") == AcmeStatus.INVALID:
                # Table 2: caa → ACME_CAA, rejectedIdentifier → ACME_REJECTED, a failed
                # validation → ACME_INVALID_ORDER, each with the CA's detail.
                raise challenge_failure(challenge.get("error"), "challenge invalid") from None
            if challenge.get("status") not in (AcmeStatus.PROCESSING, AcmeStatus.VALID):
                raise

    # -- wait_for_order ----------------------------------------------------

    async def follow(self, input: WaitForOrderInput) -> OrderProgress:
        accepted = await self._accept_once(input)
        try:
            return await self._poll_until_issuable(input, accepted)
        except AcmeProblemError as err:
            err.accepted = err.accepted or accepted
            raise

    async def _accept_once(self, input: WaitForOrderInput) -> bool:
        """Ask the CA to validate, once: never again once it answered an accept
        (Boulder starts a second validation for a second POST, and counts each
        failure: ra.go PerformValidation). Whether this activity's earlier try got
        an answer is in its heartbeat; a kept order (``accept_unsure``) or a retry
        without one reads the challenge first and POSTs only while it is pending.
        True when this call's accept was answered."""
        if not input.accept_first or not input.challenge_url:
            return False
        details = activity.info().heartbeat_details
        if details and isinstance(details[0], dict) and details[0].get("accepted"):
            return True
        url = input.challenge_url
        if input.accept_unsure or activity.info().attempt > 1:
            challenge = await self._call(lambda client: self._post_as_get(client, url), poll=True)
            if challenge.body.get("status") != AcmeStatus.PENDING:
                return True  # answered before: validating, or done
        await self._call(lambda client: self._accept(client, url))
        activity.heartbeat({"accepted": True})
        return True

    async def _poll_until_issuable(self, input: WaitForOrderInput, accepted: bool) -> OrderProgress:
        """Poll fast until the order is ready or valid, or the window ends; never
        POST the challenge again (SPEC §3 step 5)."""
        deadline = time.monotonic() + input.within_seconds
        interval = FAST_POLL_FIRST
        while True:
            fetched = await self._poll(input.order_url)
            # A retry of this activity must know the accept was answered.
            activity.heartbeat(*([{"accepted": True}] if accepted else []))
            status = _order_status(fetched.body)
            if status in ISSUABLE:
                return OrderProgress(status=status)
            if status is AcmeStatus.INVALID:
                raise await self._invalid_order(fetched.body)
            now = time.monotonic()
            # The CA's pacing wins: a Retry-After beyond the window ends it early.
            wait = max(interval, fetched.retry_after or 0.0)
            if now >= deadline or now + wait > deadline and fetched.retry_after:
                if accepted and status is AcmeStatus.PENDING:
                    await self._raise_if_authorization_failed(fetched.body)
                return OrderProgress(status=status, retry_after_seconds=fetched.retry_after)
            await asyncio.sleep(min(wait, max(0.0, deadline - now)))
            interval = min(interval * 1.5, FAST_POLL_MAX)

    async def _raise_if_authorization_failed(self, order: dict[str, Any]) -> None:
        """An order still pending after its challenge was answered, whose
        authorization is invalid, is invalid (RFC 8555 §7.1.6), whether or not the CA
        says so yet (acme2certifier 0.46 leaves such an order pending for ever)."""
        for url in list(order.get("authorizations") or []):
            authz = await self._call(lambda client: self._post_as_get(client, url), poll=True)
            if authz.body.get("status") == AcmeStatus.INVALID:
                raise await self._invalid_order({**order, "authorizations": [url]})

    async def _invalid_order(self, order: dict[str, Any]) -> AcmeProblemError:
        """Explain an invalid order with the failed challenge's problem, when there is one."""
        problem: dict[str, Any] = dict(order.get("error") or {})
        authz_urls = list(order.get("authorizations") or [])
        if authz_urls and not problem:
            try:
                authz = await self._call(lambda client: self._post_as_get(client, authz_urls[0]))
                for chall in authz.body.get("challenges", []):
                    if chall.get("error"):
                        problem = dict(chall["error"])
                        break
            except ProvisioningError:
                pass
        return challenge_failure(problem, "the order became invalid")

    # -- finalize_and_store --------------------------------------------------

    async def finalize(self, input: FinalizeInput) -> IssuedCertificate:
        stored = await issued.issued_by_order(
            self._pool, input.certificate_id, input.order_url
        )
        if stored is not None:  # an earlier attempt committed
            stored_leaf, stored_window = stored
            return _issued(certificate_info(stored_leaf), stored_window)
        order = (await self._call(lambda client: self._post_as_get(client, input.order_url))).body
        status = order.get("status")
        encrypted = await issued.load_pending_key(
            self._pool, input.certificate_id, input.order_url
        )
        if status == AcmeStatus.READY:
            if encrypted is None:
                key = generate_private_key(self._key_type)
                encrypted = self._key.encrypt(private_key_to_pem(key))
                if not await issued.store_pending_key(
                    self._pool, input.certificate_id, input.order_url, encrypted
                ):
                    raise AcmeProblemError(
                        code=ErrorCode.ACME_INVALID_ORDER,
                        message="the order is no longer the certificate's open order",
                    )
            else:
                key = self._decrypt_key(encrypted)
            csr = make_csr(key, input.hostname)
            finalize_url = str(order["finalize"])
            await self._call(lambda client: self._begin_finalize(client, finalize_url, csr))
        elif status in (AcmeStatus.PROCESSING, AcmeStatus.VALID):
            if encrypted is None:
                # Finalized with a key that was never stored: nothing can pair it.
                raise AcmeProblemError(
                    code=ErrorCode.ACME_INVALID_ORDER,
                    message="the order was finalized without a stored key; a new order is needed",
                )
            key = self._decrypt_key(encrypted)
        elif status == AcmeStatus.INVALID:
            raise await self._invalid_order(order)
        else:
            raise AcmeProblemError(
                code=ErrorCode.ACME_TEMPORARY, message=f"order is {status}, not ready to finalize"
            )

        certificate_url = await self._wait_until_issued(input.order_url)
        fullchain = await self._call(lambda client: self._download(client, certificate_url))
        leaf, chain = split_fullchain(fullchain)
        if not public_key_matches(leaf, key):
            raise AcmeProblemError(
                code=ErrorCode.ACME_INVALID_ORDER,
                message="the issued certificate does not match the stored key",
            )
        info = certificate_info(leaf)
        window = await self._first_renewal_info(leaf)
        if not await issued.store_issued(
            self._pool,
            input.certificate_id,
            input.order_url,
            leaf,
            chain,
            info,
            window,
            next_check(window) if window.window_start is not None else None,
        ):
            raise AcmeProblemError(
                code=ErrorCode.ACME_INVALID_ORDER,
                message="the certificate row moved on before the certificate could be stored",
            )
        return _issued(info, window)

    async def _first_renewal_info(self, leaf_pem: str) -> RenewalAdvice:
        """The new certificate's ARI window, asked once before it is stored (best
        effort, short): the workflow then sleeps straight to it, and the sweep's first
        look finds nothing moved — no signal, no extra workflow task per renewal."""
        base_url = self._clients.account.directory_json.get("renewalInfo")
        url = renewal_info_url(str(base_url), leaf_pem) if base_url else None
        if url is None:
            return RenewalAdvice()
        activity.heartbeat()
        return await fetch_renewal_info(
            self._clients, self._executor, url, timeout=FIRST_RENEWAL_INFO_TIMEOUT
        )

    def _decrypt_key(self, encrypted: bytes) -> Any:
        try:
            return load_private_key(self._key.decrypt(encrypted))
        except DecryptionError as err:
            raise AcmeProblemError(code=ErrorCode.ACME_TEMPORARY, message=str(err)) from None

    def _begin_finalize(self, client: acme_client.ClientV2, finalize_url: str, csr: bytes) -> None:
        request = messages.CertificateRequest(csr=x509.load_pem_x509_csr(csr))
        try:
            client.net.post(finalize_url, request, new_nonce_url=self._clients.new_nonce_url)
        except messages.Error as err:
            # A repeated finalize (activity retry) finds the order already processing.
            if err.code not in ("orderNotReady", "malformed"):
                raise

    async def _wait_until_issued(self, order_url: str) -> str:
        deadline = time.monotonic() + FINALIZE_WAIT
        interval = FAST_POLL_FIRST
        while True:
            fetched = await self._poll(order_url)
            order = fetched.body
            activity.heartbeat()
            if order.get("status") == AcmeStatus.VALID and order.get("certificate"):
                return str(order["certificate"])
            if order.get("status") == AcmeStatus.INVALID:
                raise await self._invalid_order(order)
            if time.monotonic() >= deadline:
                raise AcmeProblemError(
                    code=ErrorCode.ACME_TEMPORARY,
                    message=f"order still {order.get('status')} {FINALIZE_WAIT:.0f}s after finalize",
                )
            await asyncio.sleep(max(interval, fetched.retry_after or 0.0))
            interval = min(interval * 1.5, FAST_POLL_MAX)

    async def _poll(self, url: str) -> _Fetched:
        """POST-as-GET an order (or authorization), paced with every other poll of
        this worker."""
        await self._polls.acquire()
        return await self._call(lambda client: self._post_as_get(client, url), poll=True)

    def _download(self, client: acme_client.ClientV2, certificate_url: str) -> str:
        response = client.net.post(
            certificate_url, None, new_nonce_url=self._clients.new_nonce_url
        )
        return str(response.text)

    # -- renewal_info (ARI, RFC 9773) -------------------------------------------

    async def renewal_advice(self, certificate_id: str) -> RenewalAdvice:
        base_url = self._clients.account.directory_json.get("renewalInfo")
        leaf_pem = await attempts.current_certificate_pem(self._pool, certificate_id)
        if not base_url or leaf_pem is None:
            return RenewalAdvice()
        url = renewal_info_url(str(base_url), leaf_pem)
        if url is None:
            return RenewalAdvice()
        return await fetch_renewal_info(self._clients, self._executor, url)

    # -- cancel and delete ------------------------------------------------------

    async def deactivate(self, order_url: str) -> None:
        def deactivate(client: acme_client.ClientV2) -> None:
            order = self._post_as_get(client, order_url).body
            for authz_url in order.get("authorizations") or []:
                authz = self._post_as_get(client, authz_url).body
                if authz.get("status") in (AcmeStatus.PENDING, AcmeStatus.VALID):
                    client.net.post(
                        authz_url,
                        messages.UpdateAuthorization(status=str(AcmeStatus.DEACTIVATED)),
                        new_nonce_url=self._clients.new_nonce_url,
                    )

        await self._call(deactivate)

    async def revoke(self, certificate_id: str) -> None:
        leaf_pem = await attempts.current_certificate_pem(self._pool, certificate_id)
        if leaf_pem is None:
            return
        cert = x509.load_pem_x509_certificate(leaf_pem.encode())

        def revoke(client: acme_client.ClientV2) -> None:
            try:
                client.revoke(cert, 0)
            except messages.Error as err:
                if err.code != "alreadyRevoked":
                    raise

        await self._call(revoke)


class Issuers:
    """The configured CAs, in order of preference, each with its orders; finds the
    one an activity's input or row names (None: the first configured, for inputs
    and rows from before issuers)."""

    def __init__(
        self,
        issuers: AcmeClients | Sequence[AcmeClients],
        pool: asyncpg.Pool,
        encryption_key: EncryptionKey,
        key_type: KeyType,
        executor: ThreadPoolExecutor,
        metrics: CertflowMetrics,
        pacing: OrderPacing = OrderPacing(),
    ) -> None:
        listed = [issuers] if isinstance(issuers, AcmeClients) else list(issuers)
        if not listed:
            raise ValueError("at least one issuer is needed")
        polls = PollPacer(pacing.polls_per_second)  # one budget for every CA together
        self._orders = [
            IssuerOrders(clients, pool, encryption_key, key_type, executor, metrics, pacing, polls)
            for clients in listed
        ]

    def at(self, name: str | None) -> IssuerOrders:
        """The issuer called ``name`` (None: the first configured)."""
        if name is None:
            return self._orders[0]
        for orders in self._orders:
            if orders.name == name:
                return orders
        raise AcmeProblemError(
            code=ErrorCode.ACME_INVALID_ORDER,
            message=f"the issuer {name!r} is no longer configured on this worker",
        )

    async def on(self, name: str | None, call: Callable[[IssuerOrders], Awaitable[T]]) -> T:
        """``call`` on the issuer called ``name``, its account registered."""
        orders = self.at(name)
        await orders.ready()
        return await call(orders)

    def serving(self, url: str) -> IssuerOrders:
        """The issuer whose orders are on the host of ``url`` (an order URL from a
        call that names no issuer), told by its newOrder URL; the first otherwise."""
        origin = urllib.parse.urlsplit(url)[:2]
        for orders in self._orders:
            if orders.order_origin == origin:
                return orders
        return self._orders[0]
