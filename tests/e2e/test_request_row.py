"""A request's row is written by one INSERT, the client's, which hands it to the
workflow: its first run reads nothing, and its first attempt's first write (the
try at an order slot, or the failure) marks the row as having had a workflow
(reconcile's cue). A workflow started by other code marks it in its first step;
every later run reads it without writing; a workflow a backend started with no
row inserts one. Real Postgres, the product's own store functions; a write is
seen as a new ``xmin``.

Shown red: with ``ensure_certificate`` back to ``INSERT … ON CONFLICT DO UPDATE
SET workflow_seen_at = now()`` (the code before), a later run's read wrote the row
again (its ``xmin`` moved).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from temporalio.testing import ActivityEnvironment

from activities.records import RecordActivities
from certflow.activity_payloads import EnsureCertificateInput, Outcome
from certflow.errors import ErrorCode
from certflow.hostnames import Hostname
from certflow.models import CertificateStatus, OrderKind, RequestedMethod
from certflow.store import certificates, cooldowns, reconcile, requests
from certflow.workflow_payloads import ProvisioningPolicy
from certflow.store.db import create_pool, migrate

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def pool(new_database: Callable[[str], str]) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(new_database("certflow_request_row"), max_size=2)
    await migrate(p)
    try:
        yield p
    finally:
        await p.close()


async def _row(pool: asyncpg.Pool, hostname: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT xmin::text AS xmin, workflow_seen_at, requested_method FROM certificates"
        " WHERE hostname = $1",
        hostname,
    )
    assert row is not None, hostname
    return row


async def test_a_request_row_is_inserted_once_and_marked_once(pool: asyncpg.Pool) -> None:
    hostname = Hostname("shop.request-row.test")
    written = await requests.request_certificates(pool, [hostname], "tenant-a")
    assert written.refused == []
    requested = await _row(pool, hostname)
    assert requested["workflow_seen_at"] is None

    first = await certificates.ensure_certificate(pool, hostname, "tenant-a", None)
    marked = await _row(pool, hostname)
    assert marked["workflow_seen_at"] is not None and marked["xmin"] != requested["xmin"]
    assert first.status is CertificateStatus.PENDING and first.tenant_id == "tenant-a"
    assert written.rows == {hostname: first}, "the request's row is not the row a read returns"

    again = await certificates.ensure_certificate(pool, hostname, "tenant-a", None)
    assert again == first
    assert await _row(pool, hostname) == marked, "a later run's read wrote the row"
    # A name a workflow ran for is never refused later, in that spelling only.
    assert await certificates.run_before(pool, hostname)
    assert not await certificates.run_before(pool, hostname.upper())


async def test_a_method_asked_by_the_workflow_input_is_written(pool: asyncpg.Pool) -> None:
    hostname = Hostname("method.request-row.test")
    await certificates.ensure_certificate(pool, hostname, None, None)
    before = await _row(pool, hostname)
    record = await certificates.ensure_certificate(pool, hostname, None, None, RequestedMethod.DNS_01)
    after = await _row(pool, hostname)
    assert record.requested_method is RequestedMethod.DNS_01
    assert after["requested_method"] == "dns-01" and after["xmin"] != before["xmin"]
    assert after["workflow_seen_at"] == before["workflow_seen_at"]
    await certificates.ensure_certificate(pool, hostname, None, None, RequestedMethod.DNS_01)
    assert await _row(pool, hostname) == after


async def test_a_workflow_without_a_row_inserts_it_marked(pool: asyncpg.Pool) -> None:
    hostname = Hostname("started-directly.request-row.test")
    record = await certificates.ensure_certificate(pool, hostname, "tenant-b", None)
    row = await _row(pool, hostname)
    assert record.status is CertificateStatus.PENDING and record.tenant_id == "tenant-b"
    assert record.requested_method is RequestedMethod.AUTO and row["workflow_seen_at"] is not None


async def test_a_run_given_the_request_row_marks_it_at_its_first_write(pool: asyncpg.Pool) -> None:
    """The first run of a requested hostname takes the request's row (no read): its
    try at an order slot marks the row once; a first attempt that fails before one
    marks it in recording the failure. Red without the ``seen`` CTE of
    ``try_order_slot``: workflow_seen_at stayed NULL, and reconcile would have
    started the running workflow again every pass; red without the coalesce of
    ``record_failure`` the same way for a hostname still waiting for its DNS."""
    ordering, failing = Hostname("slot.request-row.test"), Hostname("dns.request-row.test")
    written = await requests.request_certificates(pool, [ordering, failing], None)
    assert set(written.rows) == {ordering, failing}
    async with pool.acquire() as conn:
        slot, _ = await cooldowns.try_order_slot(
            conn, "https://ca.test/dir", 1, ordering, "request-row.test", OrderKind.NEW
        )
        assert slot == 0
        marked = await _row(pool, ordering)
        assert marked["workflow_seen_at"] is not None
        await conn.execute("SELECT pg_advisory_unlock_all()")
        await cooldowns.try_order_slot(conn, "https://ca.test/dir", 1, ordering, "request-row.test", OrderKind.NEW)
        assert await _row(pool, ordering) == marked, "a later try wrote the row again"
        await conn.execute("SELECT pg_advisory_unlock_all()")

    outcome = Outcome(
        status=CertificateStatus.PENDING, retry_count=0, keep_order=False, error_code=ErrorCode.DNS_CNAME
    )
    await certificates.record_failure(pool, written.rows[failing].certificate_id, outcome, "no CNAME")
    assert (await _row(pool, failing))["workflow_seen_at"] is not None
    waiting = [r.hostname for r in await reconcile.rows_without_workflow(pool, None, 10)]
    assert ordering not in waiting and failing not in waiting


async def test_the_first_step_takes_the_request_row_without_a_statement(pool: asyncpg.Pool) -> None:
    """``ensure_certificate`` given the request's row returns it with the policy and
    sends nothing to Postgres (a pool that refuses every call); a hostname under
    the managed base domain is read (whether it skips DNS checks is the row's
    ``custom_domains`` entry). Red when the row given is ignored: the pool was
    called."""
    hostname = Hostname("given.request-row.test")
    written = await requests.request_certificates(pool, [hostname], "tenant-c")
    row = written.rows[hostname]
    policy = ProvisioningPolicy()
    refusing: Any = _RefusingPool()
    given = EnsureCertificateInput(hostname=hostname, tenant_id="tenant-c", requested=row)
    ensured = await ActivityEnvironment().run(
        RecordActivities(refusing, policy, "managed.test").ensure_certificate, given
    )
    assert ensured.record == row and ensured.policy == policy
    assert (await _row(pool, hostname))["workflow_seen_at"] is None

    managed = Hostname("shop.managed.test")
    written = await requests.request_certificates(pool, [managed], None)
    under = EnsureCertificateInput(hostname=managed, requested=written.rows[managed])
    read = await ActivityEnvironment().run(
        RecordActivities(pool, policy, "managed.test").ensure_certificate, under
    )
    assert read.record.skips_dns and (await _row(pool, managed))["workflow_seen_at"] is not None
    with pytest.raises(AssertionError, match="Postgres was asked"):
        await ActivityEnvironment().run(
            RecordActivities(refusing, policy, "managed.test").ensure_certificate, under
        )


class _RefusingPool:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Postgres was asked: pool.{name}")
