"""One CA's orders, from new-order to the stored certificate (``IssuerOrders``):
its steps, each an object in a file of its own (``new_orders``, ``validation``,
``finalization``, each holding the ``ca`` exchange they share), with the renewal
info, deactivation and revocation of what they made. ``router.IssuerRouter`` picks the CA of each activity's call.

The blocking ``acme`` calls run on a thread; the waiting, heartbeats and
Postgres writes stay on the event loop. The Temporal activities that call these
are in activities/acme.py.
"""

from __future__ import annotations

from acme import messages
from acme import client as acme_client
from cryptography import x509

from certflow.acme.ari import fetch_renewal_info, renewal_info_url
from certflow.acme.exchange import IssuerExchange
from certflow.acme.finalize import OrderFinalization
from certflow.acme.new_order import NewOrders
from certflow.acme.validation import OrderValidation
from certflow.activity_payloads import RenewalAdvice
from certflow.models import AcmeStatus
from certflow.store import attempts


class IssuerOrders:
    """What the ACME activities do at one issuer (CA), with its account: its
    cooldowns, order slots, profile and ARI. :class:`AcmeActivities` picks the
    issuer of each call."""

    def __init__(self, ca: IssuerExchange) -> None:
        self.ca = ca
        """The CA's account, clients, pacing and cooldowns, shared by every step."""
        self.new_orders = NewOrders(ca)
        self.validation = OrderValidation(ca)
        self.finalization = OrderFinalization(ca)

    # -- renewal_info (ARI, RFC 9773) -------------------------------------------

    async def renewal_advice(self, certificate_id: str) -> RenewalAdvice:
        base_url = self.ca.clients.account.directory_json.get("renewalInfo")
        leaf_pem = await attempts.current_certificate_pem(self.ca.pool, certificate_id)
        if not base_url or leaf_pem is None:
            return RenewalAdvice()
        url = renewal_info_url(str(base_url), leaf_pem)
        if url is None:
            return RenewalAdvice()
        return await fetch_renewal_info(self.ca.clients, self.ca.executor, url)

    # -- cancel and delete ------------------------------------------------------

    async def deactivate(self, order_url: str) -> None:
        def deactivate(client: acme_client.ClientV2) -> None:
            order = self.ca.post_as_get(client, order_url).body
            for authz_url in order.get("authorizations") or []:
                authz = self.ca.post_as_get(client, authz_url).body
                if authz.get("status") in (AcmeStatus.PENDING, AcmeStatus.VALID):
                    client.net.post(
                        authz_url,
                        messages.UpdateAuthorization(status=str(AcmeStatus.DEACTIVATED)),
                        new_nonce_url=self.ca.clients.new_nonce_url,
                    )

        await self.ca.call(deactivate)

    async def revoke(self, certificate_id: str) -> None:
        leaf_pem = await attempts.current_certificate_pem(self.ca.pool, certificate_id)
        if leaf_pem is None:
            return
        cert = x509.load_pem_x509_certificate(leaf_pem.encode())

        def revoke(client: acme_client.ClientV2) -> None:
            try:
                client.revoke(cert, 0)
            except messages.Error as err:
                if err.code != "alreadyRevoked":
                    raise

        await self.ca.call(revoke)
