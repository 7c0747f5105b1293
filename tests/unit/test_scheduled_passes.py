"""What the scheduled passes cost each time their schedule fires: no heartbeat for
a pass that finds little to do, the event log pruned once a day, not after every
pass (docs/performance.md, "The schedules")."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, cast

import asyncpg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

import activities.pass_heartbeat as pass_heartbeat
import activities.reconcile as reconcile_activity
import activities.renewal_info as renewal_info_activity
import activities.retention as retention_activity
from activities.pass_heartbeat import heartbeat_due
from activities.reconcile import ReconcileActivities
from activities.renewal_info import RenewalInfoSweep
from activities.retention import RetentionActivities
from certflow.activity_payloads import RenewalAdvice
from certflow.store import reconcile as reconcile_store
from certflow.store import renewal_info as renewal_info_store
from certflow.store.events import PAGE as PRUNE_PAGE
from certflow.store.events import PruneResult
from certflow.store.reconcile import ReconcileRow
from certflow.store.renewal_info import RenewalInfoRow
from workflows.reconcile import prune_due

UTC = datetime.timezone.utc
DAY = datetime.datetime(2026, 12, 6, tzinfo=UTC)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _env(heartbeat_timeout: datetime.timedelta, beats: list[object]) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=heartbeat_timeout)
    env.on_heartbeat = lambda *details: beats.append(details)
    return env


def _passes_that_prune(every: datetime.timedelta) -> int:
    starts = [DAY + every * k for k in range(int(datetime.timedelta(days=1) / every))]
    return sum(prune_due(s) for s in starts)


def test_the_event_log_is_pruned_by_the_passes_of_the_first_utc_hour() -> None:
    """The passes that start in the first hour of the UTC day prune, the others do not:
    at the 15-minute default four a day, at 5 minutes twelve, at an hour one.

    Red with every pass pruning again (``prune_due`` always true: 96 a day, an
    activity each), or with the hour taken in local time or from the wrong end."""
    assert prune_due(DAY) and prune_due(DAY + datetime.timedelta(minutes=59, seconds=59))
    assert not prune_due(DAY + datetime.timedelta(hours=1))
    assert not prune_due(DAY - datetime.timedelta(seconds=1))
    assert prune_due(datetime.datetime(2026, 12, 6, 1, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=1))))
    assert _passes_that_prune(datetime.timedelta(minutes=15)) == 4
    assert _passes_that_prune(datetime.timedelta(minutes=5)) == 12
    assert _passes_that_prune(datetime.timedelta(hours=1)) == 1


def test_a_heartbeat_is_due_once_half_its_timeout_passed() -> None:
    """Red with the heartbeat due at once (every page paying one) or only at the
    timeout itself (the next page would come too late)."""
    thirty = datetime.timedelta(seconds=30)
    assert not heartbeat_due(0.0, thirty) and not heartbeat_due(14.9, thirty)
    assert heartbeat_due(15.0, thirty)
    assert not heartbeat_due(1e9, None)


def _rows(count: int, bad: bool = False) -> list[ReconcileRow]:
    created = DAY
    return [
        ReconcileRow(f"id-{i}", f"bad name {i}" if bad else f"h{i}.example.com", "t", created)
        for i in range(count)
    ]


class _Client:
    """A Temporal client with no ended workflow to list."""

    def list_workflows(self, query: str) -> AsyncIterator[Any]:
        async def nothing() -> AsyncIterator[Any]:
            return
            yield

        return nothing()


async def test_a_reconcile_pass_that_starts_nothing_sends_no_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A steady pass (no row without a workflow, no workflow ended) heartbeats not at
    all; a pass that runs long without starting anything (rows refused, 10 s a page)
    still heartbeats once half the 30 s timeout has passed.

    Red with the heartbeat back after every page (one per steady pass: an action
    each time the schedule fires), and with no heartbeat between pages (the long
    pass sends none and would be cancelled at 30 s)."""
    clock = _Clock()
    monkeypatch.setattr(pass_heartbeat, "_monotonic", clock)
    monkeypatch.setattr(reconcile_activity, "PAGE", 2)
    pages: list[list[ReconcileRow]] = []

    async def rows_without_workflow(pool: Any, after: Any, limit: int) -> list[ReconcileRow]:
        clock.now += 10.0
        return pages.pop(0) if pages else []

    async def refuse_hostname(pool: Any, certificate_id: str, reason: str) -> None:
        return None

    monkeypatch.setattr(reconcile_store, "rows_without_workflow", rows_without_workflow)
    monkeypatch.setattr(reconcile_store, "refuse_hostname", refuse_hostname)
    passes = ReconcileActivities(cast(asyncpg.Pool, None), cast(Client, _Client()), "q", 900.0)

    beats: list[object] = []
    env = _env(datetime.timedelta(seconds=30), beats)
    steady = await env.run(passes.reconcile_certificates, None)
    assert steady.checked == 0 and beats == []

    pages.extend([_rows(2, bad=True), _rows(2, bad=True), _rows(1, bad=True)])
    slow = await env.run(passes.reconcile_certificates, None)
    assert slow.total_refused == 5 and slow.total_started == 0
    assert len(beats) == 1  # at 20 s; the pass ended at 30 s


def _leaf() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sweep.example.com")])
    now = datetime.datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=90))
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(Encoding.PEM).decode()


async def test_a_short_sweep_sends_no_heartbeat_and_a_long_one_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep heartbeats once half its 10-minute timeout has passed: one page (a
    sweep at small scale) none, seven pages of 100 s (a sweep as long as one at
    500,000 certificates) two, at 300 s and 600 s.

    Red with the heartbeat after every page (1 and 7) — at the hourly default an
    action an hour at any size, seven at that one."""
    clock = _Clock()
    monkeypatch.setattr(pass_heartbeat, "_monotonic", clock)
    monkeypatch.setattr(renewal_info_activity, "PAGE", 2)
    leaf = _leaf()
    pages: list[int] = []

    async def renewal_info_due(pool: Any, limit: int) -> list[RenewalInfoRow]:
        clock.now += 100.0
        count = pages.pop(0) if pages else 0
        return [RenewalInfoRow(f"id-{i}", f"h{i}.example.com", f"{i:x}", leaf, None, None) for i in range(count)]

    async def record_renewal_info(pool: Any, rows: Any) -> None:
        return None

    async def fetch_renewal_info(clients: Any, executor: Any, url: str, timeout: float = 15.0) -> RenewalAdvice:
        return RenewalAdvice(recheck_after_seconds=43200)

    monkeypatch.setattr(renewal_info_store, "renewal_info_due", renewal_info_due)
    monkeypatch.setattr(renewal_info_store, "record_renewal_info", record_renewal_info)
    monkeypatch.setattr(renewal_info_activity, "fetch_renewal_info", fetch_renewal_info)
    issuer = SimpleNamespace(
        account_url="https://ca.example/acct/1",
        account=SimpleNamespace(directory_json={"renewalInfo": "https://ca.example/ari"}),
        issuer=SimpleNamespace(name="ca"),
    )
    beats: list[object] = []
    env = _env(datetime.timedelta(minutes=10), beats)
    with ThreadPoolExecutor(max_workers=1) as executor:
        sweep = RenewalInfoSweep(cast(asyncpg.Pool, None), [cast(Any, issuer)], executor,
                                 cast(Client, None), requests_per_second=10_000)
        pages.append(1)
        small = await env.run(sweep.sweep_renewal_info)
        assert small.asked == 1 and beats == []

        pages.extend([2, 2, 2, 2, 2, 2, 1])
        long = await env.run(sweep.sweep_renewal_info)
    assert long.asked == 13
    assert len(beats) == 2


async def test_a_prune_goes_on_while_each_call_finds_a_full_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """One prune (a day's pass) calls the store's prune again while a call comes
    back with a full load (a backlog), stops at the first short one, and stops at its
    time budget whatever is left.

    Red with one call per prune (a backlog of 250,000 events pruned at 100,000 a
    day instead of in one pass), or with no budget (a backlog past the activity's
    5-minute timeout)."""
    clock = _Clock()
    full = 20 * PRUNE_PAGE
    loads: list[int] = []

    async def prune_events(pool: Any, retention: datetime.timedelta, max_pages: int = 20) -> PruneResult:
        assert max_pages == 20
        clock.now += 30.0
        examined = loads.pop(0)
        return PruneResult(deleted=examined, examined=examined, through_id=examined)

    monkeypatch.setattr(retention_activity, "prune_events", prune_events)
    retention = RetentionActivities(cast(asyncpg.Pool, None), 400.0, clock=clock)
    env = ActivityEnvironment()

    loads.extend([full, full, 50_000])
    backlog = await env.run(retention.prune_events)
    assert (backlog.deleted, loads) == (250_000, [])

    loads.extend([full] * 10)
    budget = await env.run(retention.prune_events)
    assert budget.deleted == 4 * full and len(loads) == 6  # 120 s at 30 s a call

    loads[:] = [0, full]
    nothing = await env.run(retention.prune_events)
    assert nothing.deleted == 0 and loads == [full]
