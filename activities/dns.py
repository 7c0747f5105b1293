"""The ``check_dns`` activity: the DNS pre-checks of certflow/dns/checks.py, in a
span, with metrics, typed errors out."""

from __future__ import annotations

import time

from temporalio import activity

from certflow.dns.checks import DnsChecker
from certflow.errors import DnsCheckError, ErrorCode, to_application_error
from certflow.metrics import CertflowMetrics
from certflow.models import CheckDnsInput, DnsVerdict
from certflow.tracing import step_span


class DnsActivities:
    """The ``check_dns`` activity around a :class:`DnsChecker`."""

    def __init__(self, checker: DnsChecker, metrics: CertflowMetrics | None = None) -> None:
        self._checker = checker
        self._metrics = metrics or CertflowMetrics()

    @activity.defn(name="check_dns")
    async def check_dns(self, input: CheckDnsInput) -> DnsVerdict:
        """CNAME then CAA: the issuers CAA allows, or a typed DNS_CNAME / DNS_CAA /
        ACME_TEMPORARY error."""
        started = time.monotonic()
        try:
            with step_span("dns_check", **{"certificate.hostname": input.hostname}):
                verdict = await self._checker.check(input.hostname)
        except DnsCheckError as err:
            dns = err.code in (ErrorCode.DNS_CNAME, ErrorCode.DNS_CAA)
            self._metrics.step("dns_check", "dns_error" if dns else "error", started)
            raise to_application_error(err) from None
        self._metrics.step("dns_check", "ok", started)
        return verdict
