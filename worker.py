"""The certflow worker: Temporal workflow and activity workers plus the HTTP-01 responder.

:func:`build` wires everything (the ACME account, the Temporal worker and its
activities, the schedule); :func:`serve` connects to Postgres (applying
migrations), runs what was built until SIGTERM or SIGINT, and stops it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from temporalio.client import Client, Interceptor
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import PollerBehaviorAutoscaling, Worker

from activities import registry
from certflow.acme.router import IssuerRouter
from certflow.acme.pacing import OrderPacing
from certflow.acme.account import REGISTER_ATTEMPTS, AcmeAccount, AcmeClients, ensure_account, issuer_setting
from activities.acme import AcmeActivities
from certflow.dns.caa_verdict import CaaIssuer
from activities.dns import DnsActivities
from certflow.dns.checks import DnsChecker
from certflow.dns.http01_fetch import Http01Fetcher
from activities.preflight import PreflightActivities
from activities.obtain import ObtainActivities
from activities.reconcile import ReconcileActivities
from activities.retention import RetentionActivities
from activities.store_outage import StoreOutageInterceptor
from activities.records import RecordActivities
from activities.renewal_info import RenewalInfoSweep
from activities.webhooks import Readiness, WebhookActivities
from certflow.crypto import DecryptionError, EncryptionKey
from certflow.store.db import migrate
from certflow.connect.connections import open_postgres, open_temporal
from certflow.errors import CaUnreachableError, ConfigError, ServiceUnreachableError
from certflow.connect.payload_codec import data_converter
from certflow.connect.temporal_config import load_temporal_connection
from certflow.issuers import Issuer
from certflow.running.logs import configure_logging
from certflow.metrics import CertflowMetrics, prometheus_runtime
from certflow.running.tracing import configure_tracing
from certflow.edge.responder import ChallengeResponder, bind_listener, responder_server
from certflow.connect.settings import load_settings
from certflow.running.worker_settings import Settings
from certflow.running.schedules import install_reconcile_schedule, install_renewal_info_schedule
from certflow.search import register_search_attributes
import workflows
from workflows.certificate import CertificateWorkflow
from workflows.domain_check import DomainCheckWorkflow
from workflows.reconcile import ReconcileWorkflow
from workflows.renewal_info_sweep import RenewalInfoSweepWorkflow
from workflows.webhooks import WebhookDeliveryWorkflow

log = logging.getLogger("certflow.worker")

MAX_CONCURRENT_ACTIVITIES = 200
ACME_THREADS = 32


@dataclass
class WorkerParts:
    """What :func:`build` makes and :func:`serve` runs."""

    worker: Worker
    responder: ChallengeResponder
    metrics: CertflowMetrics
    metrics_enabled: bool
    executor: ThreadPoolExecutor


WORKFLOWS = [
    CertificateWorkflow,
    DomainCheckWorkflow,
    ReconcileWorkflow,
    RenewalInfoSweepWorkflow,
    WebhookDeliveryWorkflow,
]
"""Every workflow a worker runs."""


async def build(settings: Settings, pool: asyncpg.Pool) -> WorkerParts:
    """Everything a worker runs, wired: the ACME account, the Temporal client and
    worker with every activity, the schedule, the responder. ConfigError (or
    ServiceUnreachableError) for anything an operator must fix, before any
    request is served."""
    encryption_key = EncryptionKey(settings.encryption_key_bytes, settings.old_encryption_keys_bytes)
    issuers = settings.issuer_list
    issuer_clients = [
        await issuer_account(pool, settings, issuer, encryption_key, fallback=position > 0)
        for position, issuer in enumerate(issuers.items)
    ]
    runtime = prometheus_runtime(settings.metrics_listen) if settings.metrics_listen else None
    metrics = (
        CertflowMetrics(runtime.metric_meter, settings.expiring_soon_days) if runtime else CertflowMetrics()
    )
    temporal = load_temporal_connection(settings)
    client = await open_temporal(
        temporal, data_converter=data_converter(settings), runtime=runtime, interceptors=interceptors(settings)
    )
    executor = ThreadPoolExecutor(max_workers=ACME_THREADS, thread_name_prefix="acme")
    searchable = await register_search_attributes(client, temporal.namespace)
    policy = settings.provisioning_policy().model_copy(update={"search_attributes": searchable})
    dns = dns_checker(settings, issuer_clients)
    preflight = PreflightActivities(
        pool,
        dns,
        Http01Fetcher(
            dns,
            port=settings.http01_self_check_port,
            addresses=settings.http01_address_policy,
        ),
        metrics,
    )
    router = IssuerRouter(
        issuer_clients,
        pool,
        encryption_key,
        settings.acme_key_type,
        executor,
        metrics,
        OrderPacing(
            max_orders_in_flight=settings.max_new_orders_in_flight,
            polls_per_second=settings.acme_polls_per_second,
        ),
        settings.managed_base_domain,
    )
    acme = AcmeActivities(router, pool, metrics)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=WORKFLOWS,
        activities=registry.bound(
            RecordActivities(pool, policy, settings.managed_base_domain, metrics),
            DnsActivities(dns, metrics, pool),
            preflight,
            acme,
            ObtainActivities(acme, preflight),
            RetentionActivities(pool, settings.events_retention_days),
            ReconcileActivities(
                pool, client, settings.task_queue, settings.reconcile_interval_seconds
            ),
            RenewalInfoSweep(
                pool,
                issuer_clients,
                executor,
                client,
                requests_per_second=settings.acme_polls_per_second,
            ),
            *webhook_activities(settings, dns.readiness),
        ),
        interceptors=[StoreOutageInterceptor()],
        max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
        # Each certificate is a chain of short workflow tasks: five fixed pollers
        # left them queued at the server (N=50 in bench: 6 → 10 certificates/s).
        workflow_task_poller_behavior=PollerBehaviorAutoscaling(),
    )
    await install_schedules(client, settings)
    return WorkerParts(worker, ChallengeResponder(pool, metrics=metrics), metrics, runtime is not None, executor)


def interceptors(settings: Settings) -> list[Interceptor]:
    """The Temporal client's: OpenTelemetry tracing when an OTLP endpoint is set."""
    if not settings.otlp_endpoint:
        return []
    configure_tracing(settings.otlp_endpoint)
    # No certflow client traces (the CLI, CertflowClient, the schedules), so the
    # workflow spans must not wait for a client's span to hang from.
    return [TracingInterceptor(always_create_workflow_spans=True)]


async def install_schedules(client: Client, settings: Settings) -> None:
    """The reconcile pass and the renewal-info sweep, each when its interval is set."""
    if settings.reconcile_interval_seconds > 0:
        await install_reconcile_schedule(client, settings.task_queue, settings.reconcile_interval_seconds)
    if settings.renewal_info_sweep_seconds > 0:
        await install_renewal_info_schedule(client, settings.task_queue, settings.renewal_info_sweep_seconds)


def dns_checker(settings: Settings, issuer_clients: list[AcmeClients]) -> DnsChecker:
    """What the CA will see of a hostname, as the settings ask it to be checked."""
    issuers = settings.issuer_list
    host, port = settings.dns_resolver_address
    return DnsChecker(
        resolver=f"{host}:{port}",
        cname_target=settings.cname_target,
        caa_issuer_domain=issuers.items[0].caa_domains[0],
        # Each CA with our account URL there (once registered), for RFC 8657 accounturi.
        issuers=lambda: tuple(
            (c.issuer.name, CaaIssuer(c.issuer.caa_domains, c.account_url))
            for c in issuer_clients
        ),
        dns01=settings.dns01,
        edge_addresses=settings.edge_address_set,
        ownership_secret=settings.ownership_secret_bytes,
        require_ownership=settings.require_ownership,
        persist_issuers=frozenset(i.name for i in issuers.items if i.dns_persist),
    )


async def issuer_account(
    pool: asyncpg.Pool,
    settings: Settings,
    issuer: Issuer,
    encryption_key: EncryptionKey,
    fallback: bool,
) -> AcmeClients:
    """The issuer's account, registered (ConfigError for what an operator must fix).
    A ``fallback`` issuer whose CA does not answer does not stop the worker: it
    starts without that account, which is registered on first use."""
    setting = issuer_setting(issuer, listed=settings.issuers is not None)

    async def register(attempts: int) -> AcmeAccount:
        try:
            return await ensure_account(
                pool, issuer, settings.acme_email, encryption_key, setting, attempts
            )
        except DecryptionError as err:
            raise ConfigError(f"CERTFLOW_ENCRYPTION_KEY: {err}") from None

    try:
        return AcmeClients(await register(REGISTER_ATTEMPTS), issuer)
    except CaUnreachableError as err:
        if not fallback:
            raise
        log.warning("starting without the ACME account of %s: %s", issuer.name, err)
        return AcmeClients(None, issuer, register=lambda: register(1))


def modules_without_bytecode(package: Path = Path(workflows.__file__).parent) -> list[str]:
    """The modules of ``package`` (the workflows) without up-to-date bytecode.

    The workflow sandbox imports them afresh for every new workflow run; without
    bytecode each import compiles the source again (nothing writes a ``.pyc``
    under PYTHONDONTWRITEBYTECODE or into a read-only install): about 10 ms and
    as much CPU per run started. ``pip install`` and the Dockerfile compile them."""
    missing = []
    for source in sorted(package.glob("*.py")):
        cached = Path(importlib.util.cache_from_source(str(source)))
        if not cached.exists() or cached.stat().st_mtime < source.stat().st_mtime:
            missing.append(source.name)
    return missing


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """Run until stop is set; raises ConfigError or ServiceUnreachableError for
    problems an operator must fix."""
    load_temporal_connection(settings)  # a bad Temporal setting stops it before anything else
    pool = await open_postgres(settings.database_url, max_size=20)
    try:
        await migrate(pool)
        parts = await build(settings, pool)
        http_host, http_port = settings.http01_address
        try:
            listener = bind_listener(http_host, http_port)
        except OSError as err:
            raise ConfigError(
                f"CERTFLOW_HTTP01_LISTEN: cannot listen on {settings.http01_listen}: {err.strerror}"
            ) from None
        responder = responder_server(parts.responder, http_host, http_port)
        responder_task = asyncio.create_task(
            responder.serve(sockets=[listener]), name="http01-responder"
        )
        background = []
        if parts.metrics_enabled:
            background.append(
                asyncio.create_task(
                    parts.metrics.run_refresh(pool, settings.metrics_refresh_seconds),
                    name="metrics",
                )
            )
        log.info(
            "worker started",
            extra={"task_queue": settings.task_queue, "http01": settings.http01_listen},
        )
        if missing := modules_without_bytecode():
            log.warning(
                "workflow modules without bytecode: every new workflow run compiles them"
                " from source; compile them where they are installed (python -m compileall)",
                extra={"modules": missing},
            )
        try:
            async with parts.worker:
                stopped = asyncio.create_task(stop.wait())
                done, _ = await asyncio.wait(
                    {stopped, responder_task}, return_when=asyncio.FIRST_COMPLETED
                )
                if responder_task in done and not stop.is_set():
                    responder_task.result()
                    raise RuntimeError("the HTTP-01 responder stopped unexpectedly")
        finally:
            for task in background:
                task.cancel()
            responder.should_exit = True
            await asyncio.gather(responder_task, return_exceptions=True)
            parts.executor.shutdown(wait=False, cancel_futures=True)
        log.info("worker stopped")
    finally:
        await pool.close()


def webhook_activities(settings: Settings, readiness: Readiness) -> list[WebhookActivities]:
    if not settings.webhook_url or settings.webhook_secret is None:
        return []
    secret = settings.webhook_secret.get_secret_value().encode()
    return [WebhookActivities(settings.webhook_url, secret, readiness=readiness)]


async def main() -> int:
    try:
        settings: Settings = load_settings(Settings)
    except ConfigError as err:
        print(f"certflow: configuration error: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(settings, stop)
    except ConfigError as err:
        print(f"certflow: configuration error: {err}", file=sys.stderr)
        return 2
    except ServiceUnreachableError as err:
        print(f"certflow: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
