"""Opening an order at one CA: new-order, held back while a cooldown applies, one
at a time per order slot of the account, naming the certificate a renewal
``replaces`` (RFC 9773 §5) when the CA takes it; then place_order's row write.

Orders are not idempotent (docs/guarantees.md, "No order wasted"): once new-order answered, a short fault is
retried here rather than by the activity, which would open a second order.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from acme import messages
from acme import client as acme_client
from acme.client import _renewal_info_path_component  # acme's RFC 9773 certificate id
from cryptography import x509
from josepy import json_util
from temporalio import activity

from certflow.acme.network import classify_acme_failure
from certflow.acme.exchange import FAST_POLL_MAX, IssuerExchange
from certflow.acme.refusals import ReplacesRefusal, problem_suffix, replaces_refusal
from certflow.acme.slots import HeldBack, NoOrderSlotError, OrderSlot, order_slot
from certflow.activity_payloads import OpenedOrder, PlaceOrderInput, PlacedOrder
from certflow.dns.persist import check_challenge
from certflow.errors import AcmeProblemError, ErrorCode, ProvisioningError
from certflow.hostnames import registered_domain
from certflow.models import CertificateRecord, Cooldown, LimitScope, OrderKind, ValidationMethod
from certflow.store import accounts, attempts, certificates

AUTHZ_FETCH_BUDGET = 8.0  # of create_order's 20 s
ORDER_SLOT_WAIT = 10.0  # of place_order's 20 s
BUSY_SLOTS_RETRY_SECONDS = 5.0
REPLACES_FAILING_FOR_SECONDS = 3600.0

T = TypeVar("T")


class RenewalOrder(messages.NewOrder):
    """A new order that may name the certificate it replaces (RFC 9773 §5)."""

    replaces: str | None = json_util.field("replaces", omitempty=True)


class NewOrders:
    """create_order and place_order at one CA."""

    def __init__(self, ca: IssuerExchange) -> None:
        self._ca = ca

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
        return await self._ordered(hostname, kind, certificate_id, methods, _opened)

    async def _ordered(
        self,
        hostname: str,
        kind: OrderKind,
        certificate_id: str | None,
        methods: Sequence[ValidationMethod],
        then: Callable[[OpenedOrder, OrderSlot], Awaitable[T]],
    ) -> T:
        """``new_order``, and ``then`` with the order while its slot is held."""
        replaces = None
        if kind is not OrderKind.NEW and certificate_id is not None:
            replaces = await self._replaces(certificate_id)
        try:
            # Each try at a slot reads the cooldowns in the same statement: one that
            # holds this order back refuses it, before a slot or while waiting for one.
            async with order_slot(
                self._ca.pool,
                self._ca.directory_url,
                self._ca.pacing.max_orders_in_flight,
                timeout=ORDER_SLOT_WAIT,
                held_back=HeldBack(hostname, registered_domain(hostname), kind, self._refuse),
            ) as slot:
                order = await self._send_new_order(hostname, replaces, certificate_id, methods)
                return await then(order, slot)
        except NoOrderSlotError as err:
            raise AcmeProblemError(
                code=ErrorCode.ACME_RATE_LIMITED,
                message=f"waiting for a new-order slot of the account: {err}",
                retry_after_seconds=BUSY_SLOTS_RETRY_SECONDS,
            ) from None

    @staticmethod
    def _refuse(holding: list[Cooldown]) -> None:
        """ACME_RATE_LIMITED for the longest of the cooldowns that hold this order
        back (``holding``: longest first, never empty): nothing is sent into a
        bucket known to be empty."""
        held = holding[0]
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
            return await self._ca.call(
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
                    await attempts.note_replaces_failing(self._ca.pool, certificate_id)
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
        order = await self._ca.call(
            lambda client: self._open_order(client, hostname, None, methods), hostname=hostname
        )
        if refusal is ReplacesRefusal.FIELD and malformed:
            # Our certID is well-formed and the order went through without it: this
            # CA rejects the field. Renewals go without it for a day, then ask again.
            self._ca.clients.replaces_refused_until = await accounts.refuse_replaces(
                self._ca.pool, self._ca.directory_url
            )
        return order

    async def _replaces(self, certificate_id: str) -> str | None:
        """The RFC 9773 certID of the certificate a renewal replaces, when the CA has
        ARI and takes ``replaces`` now — unless the CA has failed to check it for
        this certificate for over REPLACES_FAILING_FOR_SECONDS (a 5xx each time): no
        refusal blocks a renewal."""
        if not self._ca.clients.takes_replaces or not self._ca.clients.account.directory_json.get("renewalInfo"):
            return None
        current = await attempts.replaced_certificate(self._ca.pool, certificate_id)
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
            profile=self._ca.profile or None,
            replaces=replaces,
        )
        response = client.net.post(
            client.directory["newOrder"], new_order, new_nonce_url=self._ca.clients.new_nonce_url
        )
        order = messages.Order.from_json(response.json())
        order_url = response.headers["Location"]
        authorization_url = order.authorizations[0]
        authz = self._fetch_authorization(client, authorization_url)
        wanted = list(methods) or [ValidationMethod.HTTP_01]
        chosen = choose_challenge(authz, wanted)
        if chosen is None:
            offered = sorted(str(c.to_partial_json().get("type")) for c in authz.challenges)
            names = ", ".join(str(m) for m in wanted)
            raise AcmeProblemError(
                code=ErrorCode.ACME_REJECTED,
                message=f"the CA {self._ca.name} offers no {names} challenge for {hostname}"
                f" (it offers {', '.join(offered) or 'none'})",
            )
        challb, method = chosen
        if method is ValidationMethod.DNS_PERSIST_01 and authz.status != messages.STATUS_VALID:
            # The record was judged against our account URL; the challenge holds what
            # the CA compares. Differing, nothing is accepted (DNS_PERSIST).
            check_challenge(
                challb.to_partial_json(), hostname, self._ca.clients.issuer.caa_domains, self._ca.clients.account_url
            )
        token = challb.chall.encode("token") if hasattr(challb.chall, "token") else ""
        return OpenedOrder(
            order_url=order_url,
            authorization_url=authorization_url,
            challenge_url=challb.uri,
            token=token,
            key_authorization=self._ca.clients.key_authorization(token) if token else "",
            replaces=replaces,
            method=None if method is ValidationMethod.HTTP_01 and not methods else method,
            authorized=authz.status == messages.STATUS_VALID,
        )

    def _fetch_authorization(
        self, client: acme_client.ClientV2, authorization_url: str
    ) -> messages.Authorization:
        """The CA created the order when new-order answered, and orders are not
        idempotent (docs/guarantees.md, "No order wasted"): a short fault fetching its authorization is retried
        here, because a retry of the whole activity would open a second order."""
        deadline = time.monotonic() + AUTHZ_FETCH_BUDGET
        delay = FAST_POLL_MAX
        while True:
            try:
                authorization: messages.Authorization = messages.Authorization.from_json(
                    self._ca.post_as_get(client, authorization_url).body
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

    async def place(self, input: PlaceOrderInput) -> PlacedOrder:
        # Only a retry can find an order of its own on the row (the workflow calls this
        # when the row had none), so a first try spends no read on it.
        if activity.info().attempt > 1:
            stored = await certificates.stored_open_order(
                self._ca.pool, input.certificate_id, self._ca.managed_base_domain
            )
            if stored is not None:
                return stored
        try:
            order, row = await self._ordered(
                input.hostname, input.kind, input.certificate_id, input.methods, self._persisting(input)
            )
        except ProvisioningError:
            # The attempt's CA is on the row before the workflow waits on its
            # cooldowns (cooldown_remaining reads it); with an order, persisting it
            # records the CA too.
            if input.issuer is not None:
                await attempts.choose_issuer(
                    self._ca.pool, input.certificate_id, self._ca.name, input.issuer_reason
                )
            raise
        if row is None:
            raise ProvisioningError(
                code=ErrorCode.ACME_INVALID_ORDER, message="the certificate row moved on"
            )
        return PlacedOrder(**order.model_dump(), row=row)

    def _persisting(
        self, input: PlaceOrderInput
    ) -> Callable[[OpenedOrder, OrderSlot], Awaitable[tuple[OpenedOrder, CertificateRecord | None]]]:
        """place_order's row write, run on the order slot's connection: one
        statement persists the challenge and lets go of the slot. Committed before
        anything asks the CA to validate, so the responder can answer its first
        request."""

        async def persist(
            order: OpenedOrder, slot: OrderSlot
        ) -> tuple[OpenedOrder, CertificateRecord | None]:
            reason = input.method_reason
            if order.authorized:
                reason = f"{order.method or 'http-01'}: the CA {self._ca.name} reused a valid authorization"
            elif reason is not None and input.methods and order.method is not input.methods[0]:
                reason = f"{order.method}: the CA {self._ca.name} offers no {input.methods[0]} challenge"
            row = await certificates.persist_challenge(
                slot.connection,
                input.certificate_id,
                order,
                reason,
                self._ca.name if input.issuer is not None else None,
                input.issuer_reason,
                self._ca.managed_base_domain,
                let_go=(slot.directory_url, slot.number),
            )
            slot.let_go = True
            return order, row

        return persist


def choose_challenge(
    authz: messages.Authorization, wanted: Sequence[ValidationMethod]
) -> tuple[messages.ChallengeBody, ValidationMethod] | None:
    """The challenge to answer: the first of ``wanted`` the authorization offers.
    An authorization the CA reused already valid needs none: Boulder lists only
    the challenge that validated it, whatever its type, and the order is ready,
    so that challenge is taken (its type when certflow knows it, else the first
    wanted). None: nothing to answer with."""
    # An unknown type (dns-persist-01 to acme 5.9) is an UnrecognizedChallenge,
    # whose class has no ``typ``: the type is in its JSON.
    offered = {str(c.to_partial_json().get("type")): c for c in authz.challenges}
    if authz.status == messages.STATUS_VALID and authz.challenges:
        valid = [c for c in authz.challenges if c.status == messages.STATUS_VALID] or list(authz.challenges)
        kind = str(valid[0].to_partial_json().get("type"))
        known = {str(m): m for m in ValidationMethod}
        return valid[0], known.get(kind, wanted[0])
    for method in wanted:
        if str(method) in offered:
            return offered[str(method)], method
    return None


async def _opened(order: OpenedOrder, slot: OrderSlot) -> OpenedOrder:
    """create_order's ``then``: the order as opened (the slot is let go after)."""
    return order
