"""A certflow deployment of its own behind the fault proxy, for the failure-policy tests.

Its own Pebble + challtestsrv (so its worker can own Pebble's HTTP-01 port on
127.0.0.1), the fault proxy in front of that Pebble, its own database and task
queue, and one worker pointed at the proxy; the session Temporal dev server is
shared. Extra workers on the same Pebble listen on other loopback addresses
(127.0.0.2, ...) on the same port: only the 127.0.0.1 one is reached by the CA,
and it answers every worker's challenges because they live in the shared
database.
"""

from __future__ import annotations

import asyncio
import contextlib
import base64
import gzip
import http.server
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from temporalio.api.enums.v1 import EventType

from devstack import servers
from devstack.faultproxy import Endpoint, FaultProxy, Forwarded, start_fault_proxy
from certflow.connect.settings import ClientSettings
from certflow.product.client import CertflowClient
from certflow.workflow_payloads import CertificateState

ROOT = Path(__file__).resolve().parents[2]
CNAME_TARGET = "edge.saas.test"
MANAGED_BASE_DOMAIN = "managed.test"

# Short policy timings (docs/lifecycle.md, "Statuses and errors" behaviour, seconds instead of minutes/hours).
SHORT_POLICY = {
    "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
    "CERTFLOW_DNS_RECHECK_MAX_SECONDS": "2",
    "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
    "CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS": "2",
    "CERTFLOW_FAILED_RETRY_SECONDS": "0",
    "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
}


@dataclass
class FinalizeTrap:
    """Counts one hostname's orders and finalize answers at the CA, through the
    proxy, and runs ``action``, once, when Pebble has answered a finalize of one of
    its orders with 200: in the proxy's thread, before the answer is relayed, so the
    worker has not seen it yet."""

    proxy: FaultProxy
    hostname: str
    action: Callable[[], None]
    orders_created: int = 0
    """201 answers to new-order requests naming the hostname."""
    finalize_paths: set[str] = field(default_factory=set)
    finalize_answers: list[int] = field(default_factory=list)
    """Pebble's statuses for finalize requests of the hostname's orders."""
    fired: threading.Event = field(default_factory=threading.Event)
    """Set once ``action`` has returned (a test waiting on it finds the action done)."""
    _claimed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_new_order(self, request: Forwarded) -> None:
        if self.hostname not in request.identifiers or request.status != 201:
            return
        order = json.loads(request.response_body)
        with self._lock:
            self.orders_created += 1
            self.finalize_paths.add(urllib.parse.urlsplit(order["finalize"]).path)

    def on_finalize(self, request: Forwarded) -> None:
        with self._lock:
            if urllib.parse.urlsplit(request.path).path not in self.finalize_paths:
                return
            self.finalize_answers.append(request.status)
            fire = not self._claimed and request.status == 200
            self._claimed |= fire
        if fire:
            self.action()
            self.fired.set()

    def install(self) -> list[Callable[[], None]]:
        """Register the hooks; returns the functions that remove them."""
        return [
            self.proxy.on_forwarded(Endpoint.NEW_ORDER, self.on_new_order),
            self.proxy.on_forwarded(Endpoint.FINALIZE, self.on_finalize),
        ]


def unique_label() -> str:
    return uuid.uuid4().hex[:10]


class WorkerDidNotStart(AssertionError):
    """A worker process exited (or never listened) during start-up."""


def wait_listening(host: str, port: int, worker: servers.WorkerProcess, timeout: float = 60) -> None:
    """Block until ``host:port`` accepts connections; fail as soon as the worker exits.

    ``WorkerProcess.start`` probes 127.0.0.1 whatever the listen address, so a
    worker on 127.0.0.2 looks ready as soon as the 127.0.0.1 one is (even while
    it is dying); this checks the real address and the process.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            pass
        code = worker._process.exited()  # devstack has no public accessor
        if code is not None or time.monotonic() > deadline:
            worker.stop()
            log = worker.log.read_text(errors="replace")[-3000:]
            reason = f"exited with code {code}" if code is not None else f"not listening after {timeout}s"
            raise WorkerDidNotStart(f"worker on {host}:{port} {reason}\n--- log tail ---\n{log}")
        time.sleep(0.05)


@dataclass
class Stack:
    """Pebble + fault proxy + database + task queue + worker(s)."""

    pebble: servers.PebbleStack
    proxy: FaultProxy | None
    temporal: servers.TemporalDevServer
    database_url: str
    env: dict[str, str]
    worker: servers.WorkerProcess
    workdir: Path
    extra_workers: list[servers.WorkerProcess] = field(default_factory=list)
    failed_starts: list[str] = field(default_factory=list)
    """First lines of the errors of worker starts that failed and were retried."""

    @property
    def task_queue(self) -> str:
        return self.env["CERTFLOW_TASK_QUEUE"]

    @property
    def http01_port(self) -> int:
        return self.pebble.http01_port

    def hostname(self, label: str = "shop") -> str:
        """A unique hostname whose CNAME already points at the edge."""
        host = f"{label}.c{unique_label()}.test"
        self.pebble.set_cname(host, CNAME_TARGET)
        return host

    def bare_hostname(self, label: str = "shop") -> str:
        return f"{label}.c{unique_label()}.test"

    def managed_hostname(self, label: str = "shop") -> str:
        """A hostname under the managed base domain: no DNS checks, and its A
        record (challtestsrv) is what Pebble connects to for HTTP-01."""
        return f"{label}-{unique_label()}.{MANAGED_BASE_DOMAIN}"

    def client_env(self, task_queue: str | None = None) -> dict[str, str]:
        return {
            "CERTFLOW_DATABASE_URL": self.database_url,
            "CERTFLOW_TEMPORAL_ADDRESS": self.temporal.address,
            "CERTFLOW_TASK_QUEUE": task_queue or self.task_queue,
        }

    def start_extra_worker(
        self,
        name: str,
        listen_host: str,
        *,
        extra: dict[str, str] | None = None,
        task_queue: str | None = None,
    ) -> servers.WorkerProcess:
        """Another worker on the same database and Pebble (same HTTP-01 port on
        another loopback address); same task queue unless told otherwise."""
        env = {
            **self.env,
            "CERTFLOW_HTTP01_LISTEN": f"{listen_host}:{self.http01_port}",
            "CERTFLOW_METRICS_LISTEN": f"{listen_host}:{servers.free_port()}",
            **(extra or {}),
        }
        if task_queue is not None:
            env["CERTFLOW_TASK_QUEUE"] = task_queue
        worker = servers.start_worker(self.workdir, env, name=name)
        wait_listening(listen_host, self.http01_port, worker)
        self.extra_workers.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.extra_workers:
            worker.stop()
        self.worker.stop()
        if self.proxy is not None:
            self.proxy.stop()
        self.pebble.stop()


def build_stack(
    workdir: Path,
    temporal: servers.TemporalDevServer,
    database_url: str,
    *,
    nonce_reject_percent: int = 0,  # 0: request counts at the proxy are exact
    with_proxy: bool = True,
    extra: dict[str, str] | None = None,
    worker_attempts: int = 1,
) -> Stack:
    """Start Pebble (+ proxy) and one worker on 127.0.0.1:<Pebble's HTTP-01 port>."""
    pebble = servers.start_pebble(workdir / "pebble", nonce_reject_percent=nonce_reject_percent)
    proxy = None
    try:
        if with_proxy:
            proxy = start_fault_proxy(pebble, workdir / "pebble")
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=database_url,
            encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
            cname_target=CNAME_TARGET,
            task_queue=f"certflow-faults-{unique_label()}",
            extra={
                **SHORT_POLICY,
                "CERTFLOW_MANAGED_BASE_DOMAIN": MANAGED_BASE_DOMAIN,
                "CERTFLOW_METRICS_LISTEN": f"127.0.0.1:{servers.free_port()}",
                "CERTFLOW_METRICS_REFRESH_SECONDS": "1",
                **({"CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url} if proxy else {}),
                **(extra or {}),
            },
        )
        failed: list[str] = []
        worker = _start_worker_with_attempts(workdir / "workers", env, worker_attempts, failed)
    except BaseException:
        if proxy is not None:
            proxy.stop()
        pebble.stop()
        raise
    return Stack(
        pebble, proxy, temporal, database_url, env, worker, workdir / "workers", failed_starts=failed
    )


def _start_worker_with_attempts(
    workdir: Path, env: dict[str, str], attempts: int, failed: list[str]
) -> servers.WorkerProcess:
    for attempt in range(1, attempts + 1):
        try:
            return servers.start_worker(workdir, env, name=f"worker-a{attempt}")
        except servers.StackError as err:
            lines = str(err).splitlines()
            failed.append(next((l for l in reversed(lines) if l.strip()), lines[0]))
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def client_of(env: dict[str, str]) -> AsyncIterator[CertflowClient]:
    """A client of the worker started with ``env``: its database, Temporal, task queue
    (and ownership secret, when it has one); closed on exit."""
    client = await CertflowClient.connect(
        ClientSettings(
            database_url=env["CERTFLOW_DATABASE_URL"],
            temporal_address=env["CERTFLOW_TEMPORAL_ADDRESS"],
            task_queue=env["CERTFLOW_TASK_QUEUE"],
            ownership_secret=env.get("CERTFLOW_OWNERSHIP_SECRET"),  # type: ignore[arg-type]
        )
    )
    try:
        yield client
    finally:
        await client.close()


async def connect_client(stack: Stack, task_queue: str | None = None) -> CertflowClient:
    return await CertflowClient.connect(
        ClientSettings(
            database_url=stack.database_url,
            temporal_address=stack.temporal.address,
            task_queue=task_queue or stack.task_queue,
        )
    )


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fault_stack(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    stack = build_stack(
        tmp_path_factory.mktemp("faults"), temporal, new_database("certflow_faults")
    )
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
async def fault_client(fault_stack: Stack) -> AsyncIterator[CertflowClient]:
    client = await connect_client(fault_stack)
    try:
        yield client
    finally:
        await client.close()


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, object]
    service: str


def _any_value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


class HttpAnswerer:
    """An HTTP server on address:port answering every GET with ``answer(path)`` (status,
    headers) and ``body(path)``, recording each request's Host header and path: a
    customer's web server, or the provider a hostname has not left yet."""

    def __init__(
        self,
        address: str,
        port: int,
        answer: Callable[[str], tuple[int, dict[str, str]]],
        body: Callable[[str], bytes] = lambda path: b"not here\n",
    ) -> None:
        self.requests: list[tuple[str, str]] = []
        """(Host header, path) of each request, in arrival order."""
        server = self
        make_body = body

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                server.requests.append((self.headers.get("Host", ""), self.path))
                status, headers = answer(self.path)
                body = make_body(self.path)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def requests_for(self, hostname: str) -> int:
        """How many requests named hostname in their Host header (any port)."""
        return sum(host.split(":")[0].lower() == hostname for host, _ in self.requests)


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on loopback, as a collector: ``POST /v1/traces``
    with an ``ExportTraceServiceRequest`` protobuf body (gzip or deflate allowed)."""

    def __init__(self) -> None:
        self._requests: list[ExportTraceServiceRequest] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver._requests.append(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            requests = list(self._requests)
        found = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: _any_value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append(
                            ReceivedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                attributes={a.key: _any_value(a.value) for a in span.attributes},
                                service=str(resource.get("service.name", "")),
                            )
                        )
        return found

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class ObservedStack:
    """A stack whose worker logs at DEBUG and exports its traces to ``otlp``."""

    stack: Stack
    otlp: OtlpReceiver


@pytest.fixture(scope="module")
def observed_stack(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ObservedStack]:
    """Its own Pebble, database, task queue and worker (no proxy), so counters, gauges,
    log lines and spans come from this module's actions only. The worker runs with
    ``CERTFLOW_LOG_LEVEL=DEBUG`` and ``CERTFLOW_OTLP_ENDPOINT`` at a receiver here."""
    otlp = OtlpReceiver()
    try:
        stack = build_stack(
            tmp_path_factory.mktemp("observed"),
            temporal,
            new_database("certflow_observed"),
            with_proxy=False,
            extra={"CERTFLOW_LOG_LEVEL": "DEBUG", "CERTFLOW_OTLP_ENDPOINT": otlp.url},
        )
        try:
            yield ObservedStack(stack, otlp)
        finally:
            stack.stop()
    finally:
        otlp.stop()


@pytest.fixture(scope="module")
async def observed_client(observed_stack: ObservedStack) -> AsyncIterator[CertflowClient]:
    client = await connect_client(observed_stack.stack)
    try:
        yield client
    finally:
        await client.close()


# ------------------------------------------------------------------------------ helpers


async def wait_for(
    client: CertflowClient,
    hostname: str,
    predicate: Callable[[CertificateState], bool],
    timeout: float = 60.0,
    *,
    what: str = "the condition",
    seen: list[CertificateState] | None = None,
    poll: float = 0.05,
) -> CertificateState:
    """Poll ``status`` until predicate holds; every report is appended to ``seen``."""
    deadline = time.monotonic() + timeout
    report = None
    while True:
        report = await client.status(hostname)
        if report is not None:
            if seen is not None:
                seen.append(report)
            if predicate(report):
                return report
        if time.monotonic() > deadline:
            raise AssertionError(f"{hostname}: {what} not reached in {timeout:g}s; last {report}")
        await asyncio.sleep(poll)


async def wait_all_active(
    client: CertflowClient, hostnames: list[str], timeout: float
) -> dict[str, CertificateState]:
    deadline = time.monotonic() + timeout
    while True:
        reports = {h: await client.status(h) for h in hostnames}
        if all(r is not None and r.status == "ACTIVE" for r in reports.values()):
            return reports  # type: ignore[return-value]
        if time.monotonic() > deadline:
            pending = {
                h: (r.status, r.error_code, r.error_message, r.phase) if r else None
                for h, r in reports.items()
                if r is None or r.status != "ACTIVE"
            }
            raise AssertionError(f"not ACTIVE after {timeout}s: {pending}")
        await asyncio.sleep(0.1)


@dataclass
class ActivityRecord:
    activity_type: str
    attempt: int  # attempt of the run that ended (started event's attempt)
    outcome: str  # completed / failed / timed_out / canceled / open
    failure_type: str | None
    identity: str


async def activity_history(client: CertflowClient, hostname: str) -> list[ActivityRecord]:
    """Every activity of every run of the hostname's workflow, in order: the runs
    visibility lists, and each run one of them continued as new into (visibility
    lags a moment behind a continue-as-new)."""
    workflow_id = f"certificate:{hostname}"
    runs: list[str] = []
    deadline = time.monotonic() + 10
    while not runs and time.monotonic() < deadline:
        runs = [e.run_id async for e in client.temporal.list_workflows(f"WorkflowId = '{workflow_id}'")]
        if not runs:
            await asyncio.sleep(0.2)
    runs.reverse()  # visibility lists the newest first
    records: list[ActivityRecord] = []
    done: set[str] = set()
    while runs:
        run_id = runs.pop(0)
        if run_id in done:
            continue
        done.add(run_id)
        history = await client.temporal.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        last = history.events[-1] if history.events else None
        if last is not None and last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            successor = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if successor not in done and successor not in runs:
                runs.insert(0, successor)
        scheduled: dict[int, ActivityRecord] = {}
        for event in history.events:
            kind = event.event_type
            if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                name = event.activity_task_scheduled_event_attributes.activity_type.name
                record = ActivityRecord(name, 0, "open", None, "")
                scheduled[event.event_id] = record
                records.append(record)
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started = event.activity_task_started_event_attributes
                scheduled[started.scheduled_event_id].attempt = started.attempt
                scheduled[started.scheduled_event_id].identity = started.identity
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                completed = event.activity_task_completed_event_attributes
                scheduled[completed.scheduled_event_id].outcome = "completed"
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                failed = event.activity_task_failed_event_attributes
                record = scheduled[failed.scheduled_event_id]
                record.outcome = "failed"
                record.failure_type = failed.failure.application_failure_info.type or None
                record.identity = failed.identity or record.identity
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                timed_out = event.activity_task_timed_out_event_attributes
                scheduled[timed_out.scheduled_event_id].outcome = "timed_out"
    return records


def attempts_summary(records: list[ActivityRecord]) -> str:
    """e.g. 'finalize_and_store x3' for activities that needed more than one attempt."""
    retried = [f"{r.activity_type} x{r.attempt}" for r in records if r.attempt > 1]
    return ", ".join(retried) or "none"


def run_starter(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python starter.py ARGS`` as an operator runs it, with only these CERTFLOW_ variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
    return subprocess.run(
        [sys.executable, "starter.py", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def seconds_until(moment: datetime) -> float:
    return (moment - now_utc()).total_seconds()


def describe(report: Any) -> str:
    return (
        f"{report.status} {report.error_code} retry_count={report.retry_count} "
        f"phase={report.phase!r} msg={report.error_message!r}"
    )


def scrape_metrics(env: dict[str, str]) -> dict[str, float]:
    """Every series of the worker's /metrics (labels in the name) and its value."""
    url = f"http://{env['CERTFLOW_METRICS_LISTEN']}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    series: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            # Drop the exporter's own label so tests read like dashboards.
            name = re.sub(r',?service_name="[^"]*"', "", name).replace("{,", "{").replace("{}", "")
            series[name] = float(value)
    return series


def metric_value(series: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the series of name whose labels include these."""
    total = 0.0
    for key, value in series.items():
        if key.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total
