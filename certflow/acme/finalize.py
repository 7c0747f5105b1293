"""Finalizing an order at one CA and storing what it issued (finalize_and_store).

A new private key is generated, encrypted and bound to the order in Postgres
before finalize, and never leaves this module (docs/guarantees.md, "Crash safety"): a retry pairs the
certificate with the stored key, and an order finalized with no stored key is
given up.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

from acme import messages
from acme import client as acme_client
from cryptography import x509
from temporalio import activity

from certflow.acme.ari import fetch_renewal_info, next_check, renewal_info_url
from certflow.acme.exchange import FAST_POLL_FIRST, FAST_POLL_MAX, IssuerExchange
from certflow.activity_payloads import FinalizeInput, IssuedCertificate, RenewalAdvice
from certflow.crypto import (
    CertificateInfo,
    DecryptionError,
    certificate_info,
    generate_private_key,
    load_private_key,
    make_csr,
    private_key_to_pem,
    public_key_matches,
    split_fullchain,
)
from certflow.errors import AcmeProblemError, ErrorCode
from certflow.models import AcmeStatus, CertificateRecord
from certflow.store import issued

FINALIZE_WAIT = 30.0
FIRST_RENEWAL_INFO_TIMEOUT = 5.0  # inside finalize's 10 s heartbeat timeout
QUIET_START = 3.0
"""No heartbeat in an attempt's first seconds: a finalization usually ends sooner,
and each heartbeat the server records is a billable action. The 10 s heartbeat
timeout still holds: after these seconds every poll heartbeats, and the renewal
information asked last takes at most FIRST_RENEWAL_INFO_TIMEOUT."""


def _heartbeat_after_quiet_start(started: float) -> None:
    if time.monotonic() - started >= QUIET_START:
        activity.heartbeat()


def _stored(stored: tuple[str, RenewalAdvice, CertificateRecord]) -> IssuedCertificate:
    leaf, window, row = stored
    return _issued(certificate_info(leaf), window, row)


def _issued(
    info: CertificateInfo, window: RenewalAdvice, row: CertificateRecord
) -> IssuedCertificate:
    return IssuedCertificate(
        serial_hex=info.serial_hex,
        not_before=info.not_before,
        not_after=info.not_after,
        ari_window_start=window.window_start,
        ari_window_end=window.window_end,
        issued_at=datetime.now(timezone.utc),
        row=row,
    )


def issued_url(order: dict[str, Any] | None) -> str | None:
    """The certificate URL of an order that is already valid, else None."""
    if order and order.get("status") == AcmeStatus.VALID and order.get("certificate"):
        return str(order["certificate"])
    return None


class OrderFinalization:
    """finalize_and_store at one CA."""

    def __init__(self, ca: IssuerExchange) -> None:
        self._ca = ca

    # -- finalize_and_store --------------------------------------------------

    async def finalize(self, input: FinalizeInput) -> IssuedCertificate:
        started = time.monotonic()
        # What an earlier try left (the certificate stored, a key bound) is read first
        # on a retry; a first try reads it only when the order says it may be needed.
        earlier = None
        if activity.info().attempt > 1:
            earlier = await issued.finalization(
                self._ca.pool, input.certificate_id, input.order_url, self._ca.managed_base_domain
            )
            if earlier.stored is not None:  # an earlier attempt committed
                return _stored(earlier.stored)
        order = (await self._ca.call(lambda client: self._ca.post_as_get(client, input.order_url))).body
        status = order.get("status")
        if status == AcmeStatus.READY:
            if earlier is None or earlier.pending_key is None:
                key = await self._bind_new_key(input)
            else:
                key = self._decrypt_key(earlier.pending_key)
            csr = make_csr(key, input.hostname)
            finalize_url = str(order["finalize"])
            answered = await self._ca.call(lambda client: self._begin_finalize(client, finalize_url, csr))
            order = answered or order  # the order as the CA now has it
        elif status in (AcmeStatus.PROCESSING, AcmeStatus.VALID):
            if earlier is None:
                earlier = await issued.finalization(
                    self._ca.pool, input.certificate_id, input.order_url, self._ca.managed_base_domain
                )
                if earlier.stored is not None:  # an earlier activity stored it
                    return _stored(earlier.stored)
            encrypted = earlier.pending_key
            if encrypted is None:
                # Finalized with a key that was never stored: nothing can pair it.
                raise AcmeProblemError(
                    code=ErrorCode.ACME_INVALID_ORDER,
                    message="the order was finalized without a stored key; a new order is needed",
                )
            key = self._decrypt_key(encrypted)
        elif status == AcmeStatus.INVALID:
            raise await self._ca.invalid_order(order)
        else:
            raise AcmeProblemError(
                code=ErrorCode.ACME_TEMPORARY, message=f"order is {status}, not ready to finalize"
            )
        return await self._download_and_store(input, order, key, started)

    async def _bind_new_key(self, input: FinalizeInput) -> Any:
        """A new key, stored encrypted as the order's before its CSR goes out, so a
        crash after finalize still has it; the key an earlier activity bound, when
        one did (it stopped before finalize)."""
        key = generate_private_key(self._ca.key_type)
        if await issued.store_pending_key(
            self._ca.pool, input.certificate_id, input.order_url, self._ca.key.encrypt(private_key_to_pem(key))
        ):
            return key
        # A key is bound already (an earlier activity's, which stopped before
        # finalize), or the row moved on: read which.
        earlier = await issued.finalization(
            self._ca.pool, input.certificate_id, input.order_url, self._ca.managed_base_domain
        )
        if earlier.pending_key is None:
            raise AcmeProblemError(
                code=ErrorCode.ACME_INVALID_ORDER,
                message="the order is no longer the certificate's open order",
            )
        return self._decrypt_key(earlier.pending_key)

    async def _download_and_store(
        self, input: FinalizeInput, order: dict[str, Any], key: Any, started: float
    ) -> IssuedCertificate:
        """The certificate the finalized order issues, checked against its key and
        stored with its first ARI window."""
        # An order already valid needs no poll: finalized by an earlier try, or by a
        # CA that issues within the finalize request (acme2certifier; Boulder
        # without AsyncFinalize).
        certificate_url = issued_url(order) or await self._wait_until_issued(
            input.order_url, started
        )
        fullchain = await self._ca.call(lambda client: self._download(client, certificate_url))
        leaf, chain = split_fullchain(fullchain)
        if not public_key_matches(leaf, key):
            raise AcmeProblemError(
                code=ErrorCode.ACME_INVALID_ORDER,
                message="the issued certificate does not match the stored key",
            )
        info = certificate_info(leaf)
        window = await self._first_renewal_info(leaf, started)
        row = await issued.store_issued(
            self._ca.pool,
            input.certificate_id,
            input.order_url,
            leaf,
            chain,
            info,
            window,
            next_check(window) if window.window_start is not None else None,
            self._ca.managed_base_domain,
        )
        if row is None:
            raise AcmeProblemError(
                code=ErrorCode.ACME_INVALID_ORDER,
                message="the certificate row moved on before the certificate could be stored",
            )
        return _issued(info, window, row)

    async def _first_renewal_info(self, leaf_pem: str, started: float) -> RenewalAdvice:
        """The new certificate's ARI window, asked once before it is stored (best
        effort, short): the workflow then sleeps straight to it, and the sweep's first
        look finds nothing moved — no signal, no extra workflow task per renewal."""
        base_url = self._ca.clients.account.directory_json.get("renewalInfo")
        url = renewal_info_url(str(base_url), leaf_pem) if base_url else None
        if url is None:
            return RenewalAdvice()
        _heartbeat_after_quiet_start(started)
        return await fetch_renewal_info(
            self._ca.clients, self._ca.executor, url, timeout=FIRST_RENEWAL_INFO_TIMEOUT
        )

    def _decrypt_key(self, encrypted: bytes) -> Any:
        try:
            return load_private_key(self._ca.key.decrypt(encrypted))
        except DecryptionError as err:
            raise AcmeProblemError(code=ErrorCode.ACME_TEMPORARY, message=str(err)) from None

    def _begin_finalize(
        self, client: acme_client.ClientV2, finalize_url: str, csr: bytes
    ) -> dict[str, Any] | None:
        """POST the CSR; the order as the CA answered (None when it refused a
        finalize of an order already past ready)."""
        request = messages.CertificateRequest(csr=x509.load_pem_x509_csr(csr))
        try:
            response = client.net.post(
                finalize_url, request, new_nonce_url=self._ca.clients.new_nonce_url
            )
        except messages.Error as err:
            # A repeated finalize (activity retry) finds the order already processing.
            if err.code not in ("orderNotReady", "malformed"):
                raise
            return None
        try:
            body = response.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    async def _wait_until_issued(self, order_url: str, started: float) -> str:
        deadline = time.monotonic() + FINALIZE_WAIT
        interval = FAST_POLL_FIRST
        while True:
            fetched = await self._ca.poll(order_url)
            order = fetched.body
            _heartbeat_after_quiet_start(started)
            if (url := issued_url(order)) is not None:
                return url
            if order.get("status") == AcmeStatus.INVALID:
                raise await self._ca.invalid_order(order)
            if time.monotonic() >= deadline:
                raise AcmeProblemError(
                    code=ErrorCode.ACME_TEMPORARY,
                    message=f"order still {order.get('status')} {FINALIZE_WAIT:.0f}s after finalize",
                )
            await asyncio.sleep(max(interval, fetched.retry_after or 0.0))
            interval = min(interval * 1.5, FAST_POLL_MAX)

    def _download(self, client: acme_client.ClientV2, certificate_url: str) -> str:
        response = client.net.post(
            certificate_url, None, new_nonce_url=self._ca.clients.new_nonce_url
        )
        return str(response.text)
