"""A certflow deployment of its own for the chaos suite.

Everything the chaos test breaks belongs to it alone, so nothing it does can
disturb the session's shared servers (tests/conftest.py): its own Temporal dev
server on an on-disk database (restartable), its own embedded Postgres
(restartable on the same data directory, whatever ``DATABASE_URL`` says), its
own Pebble (20 % nonce rejection, 50 % authorization reuse) and
pebble-challtestsrv, the fault proxy in front of that Pebble, and one worker
pointed at the proxy.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack import servers
from certflow.crypto import EncryptionKey
from devstack.faultproxy import FaultProxy, start_fault_proxy

CNAME_TARGET = "edge.chaos.test"
TASK_QUEUE = "certflow-chaos"
DATABASE = "certflow_chaos"

# Short policy timings (docs/lifecycle.md, "Statuses and errors" behaviour in seconds) so a certificate that
# went FAILED under chaos retries itself soon instead of a day later.
CHAOS_POLICY = {
    "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
    "CERTFLOW_DNS_RECHECK_MAX_SECONDS": "2",
    "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
    "CERTFLOW_FAILURE_BACKOFF_MAX_SECONDS": "2",
    "CERTFLOW_FAILED_RETRY_SECONDS": "2",
    "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
    "CERTFLOW_LOG_LEVEL": "INFO",
    "CERTFLOW_MANAGED_BASE_DOMAIN": "managed.chaos.test",
}
MANAGED_BASE_DOMAIN = "managed.chaos.test"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaos: kills, restarts and CA faults against a certflow deployment of its own"
        " (own Temporal, Postgres, Pebble, fault proxy and worker)",
    )


@dataclass
class ChaosStack:
    workdir: Path
    temporal: servers.TemporalDevServer
    postgres: servers.PostgresServer
    admin_url: str
    database_url: str
    pebble: servers.PebbleStack
    proxy: FaultProxy
    env: dict[str, str]
    worker: servers.WorkerProcess
    encryption_key: EncryptionKey

    @property
    def postgres_dir(self) -> Path:
        return self.workdir / "postgres"

    def restart_postgres(self, down_seconds: float = 1.0) -> None:
        """Stop Postgres (fast shutdown: every connection is cut), stay down a moment,
        start it again on the same data directory (and so the same socket/URL)."""
        self.postgres.stop()
        time.sleep(down_seconds)
        self.postgres = servers.start_embedded_postgres(self.postgres_dir)
        if self.postgres.url != self.admin_url:
            raise AssertionError(
                f"restarted Postgres moved: {self.postgres.url} != {self.admin_url}"
            )

    def worker_exit_code(self) -> int | None:
        """The worker's exit code if it exited on its own (None while it runs)."""
        return self.worker._process.exited()  # devstack has no public accessor

    def stop(self) -> None:
        for step in (self.worker.stop, self.proxy.stop, self.pebble.stop, self.temporal.stop,
                     self.postgres.stop):
            try:
                step()
            except Exception as err:  # keep tearing down the rest
                print(f"chaos teardown: {step}: {err!r}")


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosStack]:
    workdir = tmp_path_factory.mktemp("chaos")
    started: list[object] = []
    try:
        postgres = servers.start_embedded_postgres(workdir / "postgres")
        started.append(postgres)
        database_url = servers.create_database(postgres.url, DATABASE)
        temporal = servers.start_temporal(workdir / "temporal")
        started.append(temporal)
        pebble = servers.start_pebble(
            workdir / "pebble", nonce_reject_percent=20, authz_reuse_percent=50
        )
        started.append(pebble)
        proxy = start_fault_proxy(pebble, workdir / "pebble")
        started.append(proxy)
        raw_key = secrets.token_bytes(32)
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=database_url,
            encryption_key=base64.b64encode(raw_key).decode(),
            cname_target=CNAME_TARGET,
            task_queue=TASK_QUEUE,
            extra={"CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url, **CHAOS_POLICY},
        )
        worker = servers.start_worker(workdir / "worker", env, timeout=120)
    except BaseException:
        for thing in reversed(started):
            thing.stop()  # type: ignore[attr-defined]
        raise
    stack = ChaosStack(
        workdir=workdir,
        temporal=temporal,
        postgres=postgres,
        admin_url=postgres.url,
        database_url=database_url,
        pebble=pebble,
        proxy=proxy,
        env=env,
        worker=worker,
        encryption_key=EncryptionKey(raw_key),
    )
    try:
        yield stack
    finally:
        stack.stop()
