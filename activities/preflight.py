"""Checks that predict the CA's verdict before an authorization is spent.

:class:`~certflow.dns.http01_fetch.Http01Fetcher` fetches
``http://<hostname>/.well-known/acme-challenge/<token>`` exactly as Let's
Encrypt's validation authority does (docs/lifecycle.md, "Before the CA is asked"). Two activities use it: ``check_http01`` between persisting a challenge and
accepting it (a failure is HTTP01_UNREACHABLE: never sent to the CA, where each
failed validation costs one of its 5 failed authorizations per hostname per
hour), and ``check_domain``, which runs every pre-check for a hostname without
ordering anything (``starter.py check``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable

import asyncpg
from temporalio import activity

from certflow.dns.checks import DnsChecker
from certflow.dns.http01_fetch import Http01Fetcher, Http01Unreachable
from certflow.store import certificates
from certflow.store import challenges
from certflow.errors import ProvisioningError, ErrorCode, to_application_error
from certflow.metrics import CertflowMetrics
from certflow.dns.ownership import check_ownership
from certflow.hostnames import is_wildcard
from certflow.models import ValidationMethod
from certflow.workflow_payloads import DomainCheck, DomainCheckInput, DomainCheckReport
from certflow.activity_payloads import Http01CheckInput
from certflow.running.tracing import step_span

class PreflightActivities:
    """The HTTP-01 self-check before accept, and the whole check of a domain."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        dns: DnsChecker,
        fetcher: Http01Fetcher,
        metrics: CertflowMetrics | None = None,
    ) -> None:
        self._pool = pool
        self._dns = dns
        self._fetcher = fetcher
        self._metrics = metrics or CertflowMetrics()

    @activity.defn(name="check_http01")
    async def check_http01(self, input: Http01CheckInput) -> None:
        """Fetch the persisted challenge as the CA will; HTTP01_UNREACHABLE otherwise."""
        started = time.monotonic()
        try:
            with step_span("http01_check", **{"certificate.hostname": input.hostname}):
                token, key_authorization = input.token, input.key_authorization
                if token is None or key_authorization is None:
                    order = await certificates.stored_open_order(self._pool, input.certificate_id)
                    if order is None:
                        raise ProvisioningError(
                            code=ErrorCode.ACME_INVALID_ORDER,
                            message="the certificate row has no open challenge to check",
                        )
                    token, key_authorization = order.token, order.key_authorization
                await self._fetcher.check(input.hostname, token, key_authorization)
        except ProvisioningError as err:
            self._metrics.step("http01_check", "error", started)
            if isinstance(err, Http01Unreachable):
                self._metrics.http01_self_check("error", err.reason)
            raise to_application_error(err) from None
        self._metrics.step("http01_check", "ok", started)
        self._metrics.http01_self_check("ok", "")

    @activity.defn(name="check_domain")
    async def check_domain(self, input: DomainCheckInput) -> DomainCheckReport:
        """CNAME, CAA and reachability of one hostname, each reported, nothing ordered.
        Reachability uses a probe challenge the responder answers for a minute."""
        hostname = input.hostname
        checks: list[DomainCheck] = []

        async def run(name: str, check: Awaitable[str]) -> None:
            try:
                found = await check
            except ProvisioningError as err:
                checks.append(DomainCheck(name=name, ok=False, code=err.code, message=err.message))
            else:
                checks.append(DomainCheck(name=name, ok=True, message=found))

        methods = await self._dns.readiness(hostname)
        secret = self._dns.ownership_secret
        if input.tenant_id is not None and secret is not None:
            await run("ownership", check_ownership(hostname, input.tenant_id, secret, self._dns.lookup_txt))
        if not is_wildcard(hostname):
            await run("cname", self._dns.check_cname(hostname))
        await run("caa", self._dns.check_caa(hostname))
        if not is_wildcard(hostname):
            token = secrets.token_urlsafe(32)
            key_authorization = f"{token}.{secrets.token_urlsafe(32)}"
            await challenges.add_probe(self._pool, hostname, token, key_authorization)
            try:
                await run("http01", self._fetcher.check(hostname, token, key_authorization))
            finally:
                await challenges.remove_probe(self._pool, token)
        if any(m.ready and m.method is not ValidationMethod.HTTP_01 for m in methods):
            # Validated over DNS: the routing checks only say whether traffic moved.
            checks = [c for c in checks if c.name in ("caa", "ownership")] + [
                c.model_copy(update={"ok": True, "message": f"(not needed over DNS) {c.message}"})
                for c in checks
                if c.name not in ("caa", "ownership")
            ]
        return DomainCheckReport(hostname=hostname, checks=checks, methods=methods)
