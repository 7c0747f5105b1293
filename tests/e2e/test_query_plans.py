"""Every query the worker, reconcile, the renewal-info sweep, the responder, the
metrics refresh and the TLS edge helper run on a steady tick is an index read, on a
table of 100,000 certificates (issue: 100,000 hostnames on one Postgres).

The product's own functions are called, on a pool that first asks Postgres for the
plan of each statement (EXPLAIN, not executed), then runs it; every plan must be
free of sequential scans of ``certificates`` and ``certificate_events``.

Checked: with the migration's ``certificates_renewal_info_due`` index dropped the
sweep's read became a Seq Scan and this failed; likewise reconcile's without
``certificates_without_workflow``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest

from certflow.store import certificates, cooldowns
from certflow.store import attempts, challenges, issued, reconcile, renewal_info, requests
from certflow.crypto import CertificateInfo, EncryptionKey
from certflow.store.db import create_pool, migrate
from certflow.metrics import CertflowMetrics
from certflow.errors import ErrorCode
from certflow.models import CertificateStatus, OrderKind
from certflow.activity_payloads import OpenedOrder, Outcome
from certflow.edge.serving import SniCertificates
from certflow.hostnames import as_hostname

pytestmark = pytest.mark.e2e

ROWS = 100_000
WATCHED = ("certificates", "certificate_events")


@dataclass
class Plans:
    """Each statement's plan, by the SQL that produced it."""

    seen: list[tuple[str, Any]] = field(default_factory=list)

    def scans(self) -> list[tuple[str, str]]:
        found = []
        for sql, plan in self.seen:
            for node in _nodes(plan):
                if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") in WATCHED:
                    found.append((node["Relation Name"], " ".join(sql.split())[:160]))
        return found


def _nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        yield plan
        for child in plan.get("Plans", []) + ([plan["Plan"]] if "Plan" in plan else []):
            yield from _nodes(child)
    elif isinstance(plan, list):
        for item in plan:
            yield from _nodes(item)


class ExplainingPool:
    """Enough of asyncpg.Pool for certflow's data functions: each statement is
    EXPLAINed first (recorded in ``plans``), then run for real."""

    def __init__(self, conn: asyncpg.Connection, plans: Plans) -> None:
        self._conn = conn
        self.plans = plans

    async def _explain(self, sql: str, args: tuple[Any, ...]) -> None:
        head = sql.lstrip().split(None, 1)[0].upper()
        if head in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH") and "pg_advisory" not in sql:
            plan = await self._conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
            self.plans.seen.append((sql, json.loads(plan)))

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        await self._explain(sql, args)
        rows: list[asyncpg.Record] = await self._conn.fetch(sql, *args)
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        await self._explain(sql, args)
        return await self._conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        await self._explain(sql, args)
        return await self._conn.fetchval(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        await self._explain(sql, args)
        status: str = await self._conn.execute(sql, *args)
        return status

    def transaction(self, **kwargs: Any) -> Any:
        return self._conn.transaction(**kwargs)

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[ExplainingPool]:
        yield self


@pytest.fixture(scope="module")
async def big_database(new_database: Callable[..., str]) -> AsyncIterator[str]:
    url = new_database("certflow_plans")
    pool = await create_pool(url, max_size=2)
    try:
        await migrate(pool)
        await pool.execute(
            """
            INSERT INTO certificates (hostname, tenant_id, status, ssl_certificate,
                encrypted_ssl_private_key, ssl_serial, ssl_expires_at, workflow_seen_at, ari_next_check_at,
                http_challenge_token, http_challenge_key_auth, provisioning_error)
            SELECT 'h' || i || '.t' || (i % 997) || '.test', 't' || (i % 997),
                   CASE WHEN i % 10 = 0 THEN 'PENDING' WHEN i % 10 = 1 THEN 'RENEWING'
                        ELSE 'ACTIVE' END,
                   CASE WHEN i % 10 <> 0 THEN 'leaf' END,
                   CASE WHEN i % 10 <> 0 THEN '\\x00'::bytea END,
                   CASE WHEN i % 10 <> 0 THEN to_hex(i) END,
                   now() + make_interval(days => 1 + i % 60),
                   now() - interval '1 day',
                   CASE WHEN i % 10 > 1 THEN now() + make_interval(mins => i % 1440) END,
                   CASE WHEN i % 10 = 0 THEN 'tok' || i END,
                   CASE WHEN i % 10 = 0 THEN 'tok' || i || '.ka' END,
                   CASE WHEN i % 100 = 0 THEN 'ACME_RATE_LIMITED' END
            FROM generate_series(1, $1) AS i
            """,
            ROWS,
        )
        await pool.execute("ANALYZE")
        yield url
    finally:
        await pool.close()


@pytest.fixture
async def explained(big_database: str) -> AsyncIterator[ExplainingPool]:
    conn = await asyncpg.connect(big_database)
    try:
        yield ExplainingPool(conn, Plans())
    finally:
        await conn.close()


async def test_every_hot_query_reads_an_index(explained: ExplainingPool) -> None:
    db: Any = explained  # duck-typed as an asyncpg.Pool
    hostname = as_hostname("h4242.t254.test")
    pending = as_hostname("h4240.t252.test")
    cert_id = await db.fetchval("SELECT id::text FROM certificates WHERE hostname = $1", hostname)
    pending_id = await db.fetchval("SELECT id::text FROM certificates WHERE hostname = $1", pending)
    order = OpenedOrder(
        order_url="https://ca.test/o/1", challenge_url="https://ca.test/c/1",
        token=f"t{uuid.uuid4().hex}", key_authorization="ka",
    )
    now = datetime.now(timezone.utc)

    # A certificate's workflow, one step after another (after the request's row).
    await requests.request_certificates(db, [as_hostname("new.t254.test")], None)
    await certificates.ensure_certificate(db, pending, None, "saas.test")
    await certificates.load_record(db, pending_id, "saas.test")
    await attempts.choose_issuer(db, pending_id, "zerossl", "CAA does not allow letsencrypt")
    await attempts.attempt_issuer(db, pending)
    await attempts.certificate_issuer(db, cert_id)
    await certificates.persist_challenge(db, pending_id, order)
    await certificates.persist_challenge(db, pending_id, order, let_go=("https://ca.test/dir", 0))
    await certificates.stored_open_order(db, pending_id)
    await issued.store_pending_key(db, pending_id, order.order_url, b"sealed")
    await issued.finalization(db, pending_id, order.order_url)
    info = CertificateInfo(serial_hex="ab", not_before=now, not_after=now + timedelta(days=90))
    await issued.store_issued(db, pending_id, order.order_url, "leaf", "chain", info)
    await certificates.record_failure(
        db,
        cert_id,
        Outcome(
            status=CertificateStatus.PENDING,
            retry_count=0,
            keep_order=False,
            error_code=ErrorCode.DNS_CNAME,
        ),
        "no CNAME",
    )
    await certificates.reopen_failed(db, cert_id)
    await certificates.begin_renewal(db, cert_id)
    await certificates.mark_expired(db, cert_id)
    await attempts.current_certificate_pem(db, cert_id)
    await attempts.order_kind(db, hostname)
    await cooldowns.applicable_cooldowns(db, "https://ca.test/dir", hostname, "t254.test", OrderKind.NEW)
    await cooldowns.try_order_slot(db, "https://ca.test/dir", 2, hostname, "t254.test", OrderKind.NEW)
    # The responder and the product's reads.
    await challenges.challenge_key_authorization(db, "tok4240", pending)
    await challenges.label_use(db, (pending, f"*.{pending}"), 31)  # dns-01: the values in use
    await requests.certificate_state(db, hostname)
    await requests.events(db, hostname)
    await requests.waiting_for_cooldown(db)
    # Reconcile and the renewal-info sweep.
    await reconcile.rows_without_workflow(db, None, 500)
    await reconcile.rows_to_restart(db, [hostname, pending])
    due = await renewal_info.renewal_info_due(db, 500)
    assert due, "no certificate was due: the sweep's query was not exercised"
    await renewal_info.record_renewal_info(
        db,
        [(r.certificate_id, r.serial, now, now + timedelta(days=1), now + timedelta(hours=6)) for r in due],
    )
    steps = len(explained.plans.seen)

    # The metrics refresh and the TLS edge helper load everything once at start; what
    # must be cheap is every tick after that.
    metrics = CertflowMetrics()
    edge = SniCertificates(db, EncryptionKey(bytes(32)), cache_size=10)
    await metrics.refresh_from_database(db)
    await edge.refresh()
    del explained.plans.seen[steps:]
    await metrics.refresh_from_database(db)
    await edge.refresh()
    ticks = len(explained.plans.seen) - steps

    assert steps >= 25 and ticks >= 2, (steps, ticks)
    print(f"\n{steps} step plans and {ticks} tick plans checked on {ROWS} rows")
    assert not explained.plans.scans(), explained.plans.scans()
