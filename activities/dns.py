"""The DNS activities: the pre-checks of certflow/dns/checks.py (which method is
ready, CAA), and the delegated dns-01 TXT in our zone (certflow/dns/dns01.py),
published before accept and withdrawn after the order; in spans, with metrics,
typed errors out."""

from __future__ import annotations

import asyncio
import time

import asyncpg
from temporalio import activity

from certflow.dns import dns01
from certflow.dns.checks import DnsChecker
from certflow.errors import DnsCheckError, ErrorCode, ProvisioningError, to_application_error
from certflow.metrics import CertflowMetrics
from certflow.dns.ownership import check_ownership
from certflow.models import RequestedMethod
from certflow.activity_payloads import (
    CheckDnsInput,
    Dns01ChallengeInput,
    DnsVerdict,
    TransferInput,
    Transferred,
)
from certflow.store import certificates
from certflow.store import challenges
from certflow.store import requests
from certflow.running.tracing import step_span

VISIBLE_WITHIN_SECONDS = 30.0
"""How long publish_dns01 waits for every authoritative server to answer the TXT
(NOTIFY and a zone transfer take a second or two) before the workflow re-checks."""
VISIBLE_POLL_SECONDS = 0.25


class DnsActivities:
    """``check_dns`` around a :class:`DnsChecker`; ``publish_dns01`` and
    ``withdraw_dns01`` around our dns-01 zone."""

    def __init__(
        self,
        checker: DnsChecker,
        metrics: CertflowMetrics | None = None,
        pool: asyncpg.Pool | None = None,
    ) -> None:
        self._checker = checker
        self._metrics = metrics or CertflowMetrics()
        self._pool = pool

    @activity.defn(name="check_dns")
    async def check_dns(self, input: CheckDnsInput) -> DnsVerdict:
        """Ownership (when required), which validation method is ready, then CAA: the
        methods and the issuers CAA allows, or a typed OWNERSHIP_UNVERIFIED /
        DNS_CNAME / DNS_DELEGATION / DNS_PERSIST / DNS_CAA / ACME_TEMPORARY error.
        The method and tenant are the row's, read now (a request or a transfer may
        have changed them while the workflow waited) unless the workflow read them
        in the same workflow task."""
        started = time.monotonic()
        try:
            with step_span("dns_check", **{"certificate.hostname": input.hostname}):
                requested, tenant_id = input.method, None
                if input.row is not None:
                    requested, tenant_id = requested or input.row.requested_method, input.row.tenant_id
                elif self._pool is not None:
                    asked, tenant_id = await certificates.attempt_request(self._pool, input.hostname)
                    requested = requested or asked
                verdict = await self._checker.check(
                    input.hostname, requested or RequestedMethod.AUTO, tenant_id
                )
        except DnsCheckError as err:
            dns = err.code is not ErrorCode.ACME_TEMPORARY
            self._metrics.step("dns_check", "dns_error" if dns else "error", started)
            raise to_application_error(err) from None
        self._metrics.step("dns_check", "ok", started)
        return verdict

    @activity.defn(name="publish_dns01")
    async def publish_dns01(self, input: Dns01ChallengeInput) -> None:
        """Add the dns-01 TXT of the challenge persisted on the row at its label in our
        zone, next to the other row's (``x`` and ``*.x`` share the label), deleting
        leftovers no open order uses; then wait until every authoritative server of
        the zone answers it, and, when the label held another value or the other
        row finished an attempt lately, until no resolver can still hold the RRset
        without it: the challenge is accepted only after that. DNS01_UPDATE when
        our primary refuses the update, DNS01_NOT_VISIBLE when a server still lacks
        it at the end of the wait."""
        started = time.monotonic()
        try:
            with step_span("dns01_publish", **{"certificate.hostname": input.hostname}):
                zone = self._zone()
                assert self._pool is not None
                order = await certificates.stored_open_order(self._pool, input.certificate_id)
                if order is None:
                    raise ProvisioningError(
                        ErrorCode.ACME_INVALID_ORDER, "the certificate row has no open dns-01 challenge"
                    )
                value = dns01.txt_value(order.key_authorization)
                read: list[challenges.LabelUse] = []
                shared = await dns01.publish(zone, input.hostname, value, self._in_use(input.hostname, read))
                activity.heartbeat("published")
                await self._until_visible(zone, input.hostname, value)
                if shared or any(use.finished_lately for use in read):
                    await self._until_uncached()
        except ProvisioningError as err:
            self._metrics.step("dns01_publish", "error", started)
            raise to_application_error(err) from None
        self._metrics.step("dns01_publish", "ok", started)

    @activity.defn(name="transfer_certificate")
    async def transfer_certificate(self, input: TransferInput) -> Transferred:
        """Move the hostname to another tenant once that tenant's ownership record is
        seen through the resolver; OWNERSHIP_UNVERIFIED (nothing changed) otherwise."""
        try:
            secret = self._checker.ownership_secret
            if secret is None:
                raise ProvisioningError(
                    ErrorCode.OWNERSHIP_UNVERIFIED,
                    "a transfer needs a proof of ownership: set CERTFLOW_OWNERSHIP_SECRET",
                )
            await check_ownership(input.hostname, input.to_tenant, secret, self._checker.lookup_txt)
            assert self._pool is not None
            moved = await requests.transfer(self._pool, input.certificate_id, input.to_tenant)
            if moved is None:
                raise ProvisioningError(ErrorCode.ACME_INVALID_ORDER, "the certificate row is gone")
        except ProvisioningError as err:
            raise to_application_error(err) from None
        from_tenant, record = moved
        return Transferred(record=record, from_tenant=from_tenant)

    @activity.defn(name="withdraw_dns01")
    async def withdraw_dns01(self, input: Dns01ChallengeInput) -> None:
        """Delete the hostname's dns-01 TXT from our zone (after the order was valid or
        abandoned, the row's order cleared): each value at its label that no open
        order uses, one RR each; the other row's value in use stays. None there is
        no error."""
        try:
            await dns01.withdraw(self._zone(), input.hostname, self._in_use(input.hostname))
        except ProvisioningError as err:
            raise to_application_error(err) from None

    def _in_use(self, hostname: str, read: list[challenges.LabelUse] | None = None) -> dns01.InUse:
        """The TXT values of the open orders of the rows sharing the hostname's label
        (each answer also appended to ``read``)."""
        pool = self._pool
        assert pool is not None

        async def in_use() -> set[str]:
            use = await challenges.label_use(pool, dns01.sharing_names(hostname), dns01.TXT_TTL + 1)
            if read is not None:
                read.append(use)
            return {dns01.txt_value(k) for k in use.key_authorizations}

        return in_use

    def _zone(self) -> dns01.Dns01Zone:
        zone = self._checker.dns01
        if zone is None:
            raise ProvisioningError(
                ErrorCode.DNS01_UPDATE, "dns-01 is not set up on this worker (CERTFLOW_DNS01_ZONE)"
            )
        return zone

    async def _until_uncached(self) -> None:
        """Wait out :data:`dns01.TXT_TTL` (and a second) after our value is on every
        server, when the CA may have read the label lately: it held another value
        when ours was added, or the other row finished a dns-01 attempt within the
        TTL. The CA's resolver may have cached the RRset as it was then (for the
        other row's validation) and serve that copy for up to the TTL: the CA would
        find only the other value, or none ("Incorrect TXT record"), and the
        authorization would go invalid. (A wildcard requested a moment after its name
        was validated failed so 4 times in 4 on Unbound without this wait.) A label
        no row used within the TTL costs no wait; this one fits in DNS01_PUBLISH's
        60 s unless the servers took most of theirs (then the retry adds the same
        value and waits again)."""
        deadline = time.monotonic() + dns01.TXT_TTL + 1
        while (left := deadline - time.monotonic()) > 0:
            activity.heartbeat("cached")
            await asyncio.sleep(min(left, 5.0))

    async def _until_visible(self, zone: dns01.Dns01Zone, hostname: str, value: str) -> None:
        deadline = time.monotonic() + VISIBLE_WITHIN_SECONDS
        while True:
            missing = await dns01.missing_on(
                zone, hostname, value, self._checker.lookup_ns, self._checker.lookup_addresses
            )
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ProvisioningError(
                    ErrorCode.DNS01_NOT_VISIBLE,
                    f"the TXT of {zone.target(hostname)} is not on {', '.join(missing)} yet",
                )
            activity.heartbeat(len(missing))
            await asyncio.sleep(VISIBLE_POLL_SECONDS)
