"""Prometheus metrics, exported by the Temporal SDK's own exporter on
``CERTFLOW_METRICS_LISTEN`` next to the SDK's metrics.

The names and labels are the original system's (docs/operating.md, "What operators see") so existing
dashboards keep working: steps by phase and result, step durations, ACME errors
by problem type, the cooldown gauges; plus certificates by status, the soonest
expiry, the certificates expiring within EXPIRING_SOON_DAYS and the cooldowns by
scope, which the alert rules (deploy/prometheus/certflow-rules.yml) read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta, timezone

import asyncpg
from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from certflow.errors import ConfigError
from certflow.store import served
from certflow.store.changes import ChangeFeed

log = logging.getLogger(__name__)

STATUSES = ("PENDING", "PROVISIONING", "ACTIVE", "RENEWING", "FAILED", "EXPIRED", "CANCELED")


def prometheus_runtime(bind_address: str, setting: str = "CERTFLOW_METRICS_LISTEN") -> Runtime:
    """A Temporal runtime serving /metrics on bind_address, durations in seconds;
    ConfigError naming ``setting`` when it cannot listen there (the SDK raises a
    bare ValueError)."""
    try:
        return Runtime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(bind_address=bind_address, durations_as_seconds=True)
            )
        )
    except ValueError as err:
        raise ConfigError(f"{setting}: cannot listen on {bind_address}: {err}") from None


def problem_label(problem_type: str) -> str:
    """The RFC 8555 error suffix lower-cased (``ratelimited``), ``unknown`` otherwise."""
    if problem_type.startswith("urn:ietf:params:acme:error:"):
        return problem_type.rsplit(":", 1)[-1].lower()
    return "unknown"


class CertflowMetrics:
    """The certmanager_* instruments; with the no-op meter it records nothing."""

    def __init__(
        self, meter: MetricMeter = MetricMeter.noop, expiring_soon_days: float = 7.0
    ) -> None:
        self._expiring_within = timedelta(days=expiring_soon_days)
        self._steps = meter.create_counter(
            "certmanager_certificate_provision_steps_total", "Provisioning steps by phase and result"
        )
        self._durations = meter.create_histogram_float(
            "certmanager_certificate_provision_step_duration_seconds",
            "Provisioning step duration",
            "s",
        )
        self._acme_errors = meter.create_counter(
            "certmanager_certificate_acme_errors_total", "ACME errors by problem type"
        )
        self._cooldown = meter.create_gauge_float(
            "certmanager_certificate_acme_cooldown", "1 while the CA rate-limit cooldown runs"
        )
        self._cooldown_until = meter.create_gauge_float(
            "certmanager_certificate_acme_cooldown_until_timestamp_seconds",
            "When the CA rate-limit cooldown ends (Unix time; 0 when none)",
        )
        self._by_status = meter.create_gauge_float(
            "certflow_certificates", "Certificates by status"
        )
        self._soonest_expiry = meter.create_gauge_float(
            "certflow_certificate_soonest_expiry_timestamp_seconds",
            "The earliest not_after among served certificates (Unix time)",
        )
        self._expiring_soon = meter.create_gauge_float(
            "certflow_certificates_expiring_soon",
            "Certificates in use whose not_after is within EXPIRING_SOON_DAYS, by status:"
            " ACTIVE has no renewal in progress, RENEWING has one that has not landed",
        )
        self._cooldowns = meter.create_gauge_float(
            "certflow_acme_cooldowns",
            "Rate-limit cooldowns in force, by scope (account, registered_domain, hostname)",
        )
        self._http01_self_checks = meter.create_counter(
            "certflow_http01_self_check_total",
            "HTTP-01 self-checks before accept, by result and (for errors) reason",
        )
        self._responder_requests = meter.create_counter(
            "certflow_http01_responder_requests_total",
            "Requests the HTTP-01 responder answered, by result: answered (a challenge"
            " found), not_found, method_not_allowed",
        )
        self._given_up = meter.create_counter(
            "certflow_certificates_given_up_total",
            "Hostnames certflow stopped trying for, by reason: abandoned (never made"
            " ready in PENDING_TIMEOUT_DAYS), departed (expired no longer routed to us)",
        )
        self._cooldown_reset: asyncio.TimerHandle | None = None
        self._changes = ChangeFeed()
        self._counts: dict[str, int] = {}

    def step(self, phase: str, result: str, started: float) -> None:
        """Count one step and its duration (``started`` from time.monotonic())."""
        self._steps.with_additional_attributes({"phase": phase, "result": result}).add(1)
        self._durations.with_additional_attributes({"phase": phase}).record(
            time.monotonic() - started
        )

    def http01_self_check(self, result: str, reason: str) -> None:
        """Count one self-check: ``ok`` (reason empty) or ``error`` with the
        fetch's reason (connection_refused, timeout, dns, redirect, …). Many
        errors of one reason at once are an edge problem, not N customers'."""
        self._http01_self_checks.with_additional_attributes(
            {"result": result, "reason": reason or "none"}
        ).add(1)

    def responder_request(self, result: str) -> None:
        """Count one request to the HTTP-01 responder: whether the CA (or anyone)
        reaches the edge at all is the first question of a failing http-01."""
        self._responder_requests.with_additional_attributes({"result": result}).add(1)

    def given_up(self, reason: str) -> None:
        """Count one hostname given up on (``abandoned`` or ``departed``)."""
        self._given_up.with_additional_attributes({"reason": reason}).add(1)

    def acme_error(self, problem_type: str) -> None:
        self._acme_errors.with_additional_attributes({"problem_type": problem_label(problem_type)}).add(1)

    def cooldown(self, until: datetime | None) -> None:
        """Show the cooldown; it drops back to 0 by itself when it ends."""
        now = datetime.now(timezone.utc)
        running = until is not None and until > now
        self._cooldown.set(1.0 if running else 0.0)
        self._cooldown_until.set(until.timestamp() if running and until else 0.0)
        if self._cooldown_reset is not None:
            self._cooldown_reset.cancel()
            self._cooldown_reset = None
        if running and until is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._cooldown_reset = loop.call_later(
                (until - now).total_seconds(), self.cooldown, None
            )

    async def refresh_from_database(self, pool: asyncpg.Pool) -> None:
        """Certificates by status (counted once, then kept by the events since), the
        soonest expiry and the cooldown: indexed reads whose cost follows the
        changes, not the rows."""
        if not self._changes.started:
            async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
                await self._changes.start(conn)
                self._counts = await served.count_by_status(conn)
        else:
            for change in await self._changes.read(pool):
                if change.from_status is not None:
                    self._counts[change.from_status] = self._counts.get(change.from_status, 0) - 1
                if change.to_status in STATUSES:
                    self._counts[change.to_status] = self._counts.get(change.to_status, 0) + 1
        horizon = await served.horizon(pool, self._expiring_within)
        for status in STATUSES:
            self._by_status.with_additional_attributes({"status": status}).set(
                float(max(0, self._counts.get(status, 0)))
            )
        for status, count in horizon.expiring_soon.items():
            self._expiring_soon.with_additional_attributes({"status": status}).set(float(count))
        for scope, count in horizon.cooldowns_by_scope.items():
            self._cooldowns.with_additional_attributes({"scope": scope}).set(float(count))
        if horizon.soonest_expiry is not None:
            self._soonest_expiry.set(horizon.soonest_expiry.timestamp())
        self.cooldown(horizon.cooldown_until)

    async def run_refresh(self, pool: asyncpg.Pool, every_seconds: float) -> None:
        """Refresh the database-driven gauges forever (cancel the task to stop)."""
        while True:
            try:
                await self.refresh_from_database(pool)
            except (OSError, asyncpg.PostgresError) as err:
                log.warning("metrics refresh failed: %s", err)
            await asyncio.sleep(every_seconds)
