"""A request's row is written by one INSERT, the client's: the workflow's first
step marks it as having a workflow (reconcile's cue) and every later run reads it
without writing; a workflow a backend started with no row inserts one. Real
Postgres, the product's own store functions; a write is seen as a new ``xmin``.

Shown red: with ``ensure_certificate`` back to ``INSERT … ON CONFLICT DO UPDATE
SET workflow_seen_at = now()`` (the code before), a later run's read wrote the row
again (its ``xmin`` moved).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest

from certflow.hostnames import Hostname
from certflow.models import CertificateStatus, RequestedMethod
from certflow.store import certificates, requests
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
    assert await requests.request_certificates(pool, [hostname], "tenant-a") == []
    requested = await _row(pool, hostname)
    assert requested["workflow_seen_at"] is None

    first = await certificates.ensure_certificate(pool, hostname, "tenant-a", None)
    marked = await _row(pool, hostname)
    assert marked["workflow_seen_at"] is not None and marked["xmin"] != requested["xmin"]
    assert first.status is CertificateStatus.PENDING and first.tenant_id == "tenant-a"

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
