"""starter.py and worker.py as a user runs them: exit codes, messages, and bad input
that writes nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import pytest

from certflow.product.client import CertflowClient
from certflow.contract import CERTIFICATE_WORKFLOW, workflow_id_for
from certflow.store import cooldowns
from certflow.workflow_payloads import CertificateInput
from devstack import servers
from certflow.models import LimitScope
from tests.e2e.conftest import Deployment

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _client_env(deployment: Deployment) -> dict[str, str]:
    keep = ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE")
    return {k: deployment.env[k] for k in keep}


async def test_request_wait_and_status_json(deployment: Deployment) -> None:
    hostname = deployment.hostname("cli")
    result = _run(["starter.py", "request", hostname.upper(), "--wait", "60"], _client_env(deployment))
    assert result.returncode == 0, result.stderr
    assert "ACTIVE" in result.stdout

    result = _run(["starter.py", "status", hostname, "--json"], _client_env(deployment))
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["hostname"] == hostname
    assert status["status"] == "ACTIVE"
    assert status["error_code"] is None and status["error_message"] is None
    assert status["expires_at"] and status["workflow_id"] == f"certificate:{hostname}"


STATUS_RUNS = 60


async def test_commands_that_connect_exit_cleanly(deployment: Deployment) -> None:
    """``status`` (which connects to Postgres and Temporal) exits 0 every time,
    never an interpreter abort at exit: the Temporal client's Rust threads can
    abort a finalizing interpreter ("PyGILState_Release: thread state … must be
    current", temporalio/sdk-python#300), so the command line exits without that
    teardown. 60 runs, 4 at a time.

    Shown red: with ``sys.exit(main())`` in starter.py instead of
    ``exit_process(main())``, a CI run's ``status`` aborted with -6 (tests/e2e/test_demo.py);
    here 2 of 60 did."""
    hostname = deployment.hostname("cli-exit")
    env = _client_env(deployment)
    assert _run(["starter.py", "request", hostname, "--wait", "60"], env).returncode == 0

    def once(_: int) -> tuple[int, str]:
        done = _run(["starter.py", "status", hostname], env)
        return done.returncode, done.stderr

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(once, range(STATUS_RUNS)))
    aborted = [(code, err[-300:]) for code, err in results if code != 0]
    assert not aborted, f"{len(aborted)} of {STATUS_RUNS} runs: {aborted[:2]}"


async def test_request_wait_exits_1_when_not_all_active(deployment: Deployment) -> None:
    hostname = deployment.bare_hostname("cli-nocname")
    result = _run(["starter.py", "request", hostname, "--wait", "30"], _client_env(deployment))
    assert result.returncode == 1
    assert "DNS_CNAME" in result.stdout


@pytest.mark.parametrize(
    "bad",
    ["*.*.wild.test", "192.0.2.1", "localhost", "a..b.test", "under_score.test", "x" * 300 + ".test"],
)
async def test_bad_hostname_writes_nothing_and_starts_nothing(
    deployment: Deployment, db: asyncpg.Pool, bad: str
) -> None:
    good = deployment.hostname("never")
    result = _run(["starter.py", "request", good, bad], _client_env(deployment))
    assert result.returncode == 2
    assert result.stderr.startswith("certflow: invalid hostname")
    assert len(result.stderr.strip().splitlines()) == 1
    # Only this test's own names are counted: other tests share the database.
    mine = [good, bad, bad.lower()]
    assert await db.fetchval("SELECT count(*) FROM certificates WHERE hostname::text = ANY($1::text[])", mine) == 0
    assert await db.fetchval("SELECT count(*) FROM certificate_events WHERE hostname::text = ANY($1::text[])", mine) == 0
    status = _run(["starter.py", "status", good], _client_env(deployment))
    assert status.returncode == 1 and "no certificate" in status.stderr


def test_missing_setting_is_one_line_naming_it() -> None:
    result = _run(["starter.py", "status", "a.example.com"], {})
    assert result.returncode == 2
    assert result.stderr.strip() == "certflow: configuration error: CERTFLOW_DATABASE_URL is not set"
    result = _run(["worker.py"], {"CERTFLOW_DATABASE_URL": "postgresql://x/y"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "certflow: configuration error: CERTFLOW_ENCRYPTION_KEY is not set"
    )


async def test_wrong_encryption_key_stops_the_worker_and_changes_nothing(
    deployment: Deployment, db: asyncpg.Pool
) -> None:
    before = [dict(r) for r in await db.fetch("SELECT * FROM acme_accounts ORDER BY directory_url")]
    assert before, "the running worker registered an account"
    env = {
        **deployment.env,
        "CERTFLOW_ENCRYPTION_KEY": base64.b64encode(b"\x07" * 32).decode(),
        "CERTFLOW_HTTP01_LISTEN": f"127.0.0.1:{servers.free_port()}",
    }
    result = _run(["worker.py"], env, timeout=60)
    assert result.returncode == 2
    assert "CERTFLOW_ENCRYPTION_KEY" in result.stderr and "wrong key" in result.stderr
    after = [dict(r) for r in await db.fetch("SELECT * FROM acme_accounts ORDER BY directory_url")]
    assert after == before


async def test_a_profile_the_ca_does_not_offer_stops_the_worker(
    deployment: Deployment, new_database: Callable[[str], str]
) -> None:
    """Pebble 2.4's directory lists no profiles, so any profile is one it does not
    offer. On a fresh database: the worker stops before it stores an account."""
    database_url = new_database("certflow_profile")
    env = {
        **deployment.env,
        "CERTFLOW_DATABASE_URL": database_url,
        "CERTFLOW_ACME_PROFILE": "tlsserver",
        "CERTFLOW_HTTP01_LISTEN": f"127.0.0.1:{servers.free_port()}",
    }
    result = _run(["worker.py"], env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "certflow: configuration error: CERTFLOW_ACME_PROFILE: the CA does not offer"
        " profile 'tlsserver' (it offers: none)"
    )
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM acme_accounts") == 0
    finally:
        await conn.close()


async def test_cooldown_clear_by_scope_and_key(deployment: Deployment, db: asyncpg.Pool) -> None:
    """`cooldown` shows each cooldown with its scope, key, limit, until and detail;
    `--clear --scope S --key K` ends that one only; an unknown scope, a key with no
    cooldown, or a key that is no hostname exits 1 with one line and changes
    nothing. The cooldowns are planted for a directory no worker uses."""
    directory = f"https://ca-{uuid.uuid4().hex[:8]}.invalid/dir"
    domain = f"d{uuid.uuid4().hex[:8]}.test"
    for scope, key, limit in (
        (LimitScope.REGISTERED_DOMAIN, domain, "CertificatesPerDomain"),
        (LimitScope.HOSTNAME, f"shop.{domain}", "CertificatesPerFQDNSet"),
    ):
        await cooldowns.extend_cooldown(
            db, directory, scope, key, limit, 600, "urn:ietf:params:acme:error:rateLimited", f"{limit} detail"
        )

    async def planted() -> list[tuple[str, str]]:
        return sorted(
            (c.scope.value, c.scope_key)
            for c in await cooldowns.active_cooldowns(db)
            if c.directory_url == directory
        )

    before = await planted()
    assert before == [("hostname", f"shop.{domain}"), ("registered_domain", domain)]
    env = _client_env(deployment)
    for args in (
        ["--scope", "tenant"],
        ["--scope", "hostname", "--key", f"other.{domain}"],
        ["--scope", "hostname", "--key", "bad_name.test"],
        ["--key", domain],
    ):
        result = _run(["starter.py", "cooldown", "--clear", *args], env)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("certflow: ")
        assert await planted() == before, args

    shown = _run(["starter.py", "cooldown", "--json"], env)
    assert shown.returncode == 0, shown.stderr
    mine = [c for c in json.loads(shown.stdout) if c["directory_url"] == directory]
    assert {(c["scope"], c["scope_key"], c["limit_name"]) for c in mine} == {
        ("registered_domain", domain, "CertificatesPerDomain"),
        ("hostname", f"shop.{domain}", "CertificatesPerFQDNSet"),
    }
    assert all(c["until"] and c["detail"].endswith("detail") for c in mine)

    result = _run(["starter.py", "cooldown", "--clear", "--scope", "registered_domain", "--key", domain], env)
    assert result.returncode == 0, result.stderr
    assert await planted() == [("hostname", f"shop.{domain}")]
    await cooldowns.clear_cooldowns(db, LimitScope.HOSTNAME, f"shop.{domain}")


async def test_a_hostname_belongs_to_its_tenant(deployment: Deployment, db: asyncpg.Pool) -> None:
    """Tenant B's request for tenant A's hostname: exit 1, one line that names no
    tenant, nothing changed (tenant, status, the row's updated_at), one event on the
    row saying it was refused; A's own request and one without a tenant keep A. An
    UPDATE of the tenant by SQL is refused by the trigger (only a transfer may).
    Red before this change: the request rewrote tenant_id to B silently
    (``coalesce(EXCLUDED.tenant_id, …)``), exit 0, no event."""
    hostname = deployment.hostname("owned")
    env = _client_env(deployment)
    # ACTIVE first, so nothing but the request could change the row.
    first = _run(["starter.py", "request", hostname, "--tenant", "tenant-a", "--wait", "60"], env)
    assert first.returncode == 0, first.stderr
    before = await db.fetchrow(
        "SELECT tenant_id, status, updated_at FROM certificates WHERE hostname = $1", hostname
    )
    events_before = await db.fetchval(
        "SELECT count(*) FROM certificate_events WHERE hostname = $1", hostname
    )

    other = _run(["starter.py", "request", hostname, "--tenant", "tenant-b"], env)
    assert other.returncode == 1
    assert other.stderr == f"certflow: {hostname} belongs to another tenant; nothing was requested\n"
    assert "tenant-a" not in other.stderr and other.stdout == ""
    after = await db.fetchrow(
        "SELECT tenant_id, status, updated_at FROM certificates WHERE hostname = $1", hostname
    )
    assert after["tenant_id"] == "tenant-a" and after["updated_at"] == before["updated_at"]
    refused = await db.fetch(
        "SELECT message FROM certificate_events WHERE hostname = $1 ORDER BY id OFFSET $2",
        hostname,
        events_before,
    )
    assert [r["message"] for r in refused] == ["refused: requested by another tenant"]

    for same in (["--tenant", "tenant-a"], []):
        again = _run(["starter.py", "request", hostname, *same], env)
        assert again.returncode == 0, again.stderr
    assert await db.fetchval("SELECT tenant_id FROM certificates WHERE hostname = $1", hostname) == "tenant-a"

    with pytest.raises(asyncpg.CheckViolationError, match="changes only by a transfer"):
        await db.execute("UPDATE certificates SET tenant_id = 'tenant-b' WHERE hostname = $1", hostname)
    assert await db.fetchval("SELECT tenant_id FROM certificates WHERE hostname = $1", hostname) == "tenant-a"


async def test_migrate_runs_signals_each_running_certificate_of_its_task_queue(
    deployment: Deployment, client: CertflowClient
) -> None:
    """``migrate-runs`` lists the running Certificate workflows of its task queue
    (CERTFLOW_TASK_QUEUE) and signals each ``migrate`` (what a run does with it is
    tests/workflows/test_migration.py's); a run on another queue is left alone.
    Runs on a queue no worker polls: the signal lands in their history. Red
    without the TaskQueue clause of the query (the other queue's run signaled too)."""
    queues = [f"certflow-migrate-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    handles = []
    for queue in queues:
        hostname = deployment.bare_hostname("migrate")
        handles.append(await client.temporal.start_workflow(
            CERTIFICATE_WORKFLOW, CertificateInput(hostname=hostname),
            id=workflow_id_for(hostname), task_queue=queue,
        ))
    try:
        env = {**_client_env(deployment), "CERTFLOW_TASK_QUEUE": queues[0]}
        deadline = time.monotonic() + 30
        while True:  # visibility lags a start by a moment
            result = _run(["starter.py", "migrate-runs"], env)
            assert result.returncode == 0, result.stderr
            if "1 runs signaled" in result.stdout or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert "migrate-runs: 1 runs signaled (0 ended meanwhile)" in result.stdout, result.stdout
        signaled = []
        for handle in handles:
            history = await handle.fetch_history()
            signaled.append(any(
                e.workflow_execution_signaled_event_attributes.signal_name == "migrate" for e in history.events
            ))
        assert signaled == [True, False]
    finally:
        for handle in handles:
            await handle.terminate("test over")


async def test_migrate_runs_check_counts_the_runs_by_design(
    deployment: Deployment, client: CertflowClient
) -> None:
    """``migrate-runs --check`` asks each running Certificate workflow of its task
    queue for its status and counts the designs the answers name: every run
    certflow started here is of the current design, so it exits 0 and signals
    nothing. What it is for: before deploying a release that retires a design
    (docs/changing-the-workflow.md). Red with ``design`` left out of the status
    (every run counted unknown, exit 1)."""
    hostname = deployment.hostname("designs")
    await client.request([hostname])
    await client.wait([hostname], timeout=60)
    handle = client.temporal.get_workflow_handle(workflow_id_for(hostname))
    events = len((await handle.fetch_history()).events)
    result = _run(["starter.py", "migrate-runs", "--check"], _client_env(deployment))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "migrate-runs --check: design 4: " in result.stdout, result.stdout
    assert result.stdout.rstrip().endswith("0 older than the current design 4"), result.stdout
    # A query records nothing: the run's history is as it was.
    assert len((await handle.fetch_history()).events) == events
