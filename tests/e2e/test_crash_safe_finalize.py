"""docs/guarantees.md, "Crash safety" against the real CA, with the activities run in this process: how
``finalize_and_store`` and ``place_order`` treat the states a crash leaves behind.

What these show: an order already finalized (``valid``) is paired with the key stored
for it, never re-finalized with another key; an order still ``ready`` with a stored
key is finalized with that key, and storing again is a no-op; a retried
``place_order`` returns the order it committed instead of opening another.

What they do not show: the tests store the pending key themselves
(``store_pending_key``) and finalize out of band, so they never check that the
worker stores the key *before* finalize, nor that a real worker process killed
mid-exchange recovers. That is tests/e2e/test_crash_after_finalize.py (SIGKILL from
the fault proxy right after the CA answered finalize).

Isolation: the rows planted here have no workflow. On the shared deployment its
reconcile schedule would start workflows for them (once seen by the hostile-input
test as a stranger), so the schedule is held while they exist and each test deletes
its rows before the hold ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import pytest
from acme import messages
from cryptography import x509
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from certflow.acme.account import AcmeClients, ensure_account
from activities.acme import AcmeActivities
from certflow.acme.router import IssuerRouter
from certflow.metrics import CertflowMetrics
from certflow.store import certificates
from certflow.store import issued as issued_rows
from certflow.crypto import (
    generate_private_key,
    load_private_key,
    make_csr,
    private_key_to_pem,
    public_key_matches,
)
from certflow.activity_payloads import (
    AcceptChallengeInput,
    CreateOrderInput,
    FinalizeInput,
    PersistChallengeInput,
    PlaceOrderInput,
    WaitForOrderInput,
)
from certflow.errors import ErrorCode
from certflow.crypto import KeyType
from workflows.steps import SHORT_FAULT_RETRY
from certflow.product.client import CertflowClient
from tests.e2e.conftest import Deployment, reconcile_schedule_paused

pytestmark = pytest.mark.e2e

I = TypeVar("I")
O = TypeVar("O")


async def as_temporal_runs(activity: Callable[[I], Awaitable[O]], input: I) -> O:
    """Run one activity as the worker's retry policy would: an ACME_TEMPORARY
    failure (a badNonce Pebble repeats, a 5xx) is tried again, up to the 4 attempts
    of SHORT_FAULT_RETRY, each try seeing its attempt number."""
    attempts = SHORT_FAULT_RETRY.maximum_attempts
    for attempt in range(1, attempts + 1):
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, attempt=attempt)
        try:
            return await env.run(activity, input)
        except ApplicationError as err:
            if err.type != str(ErrorCode.ACME_TEMPORARY) or attempt == attempts:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module", autouse=True)
async def reconcile_held(client: CertflowClient) -> AsyncIterator[None]:
    """The deployment's reconcile schedule is held for the module: rows planted here
    must never get a workflow."""
    async with reconcile_schedule_paused(client, "tests/e2e/test_crash_safe_finalize.py"):
        yield


@pytest.fixture
async def planted(db: asyncpg.Pool) -> AsyncIterator[list[str]]:
    """Ids of the rows a test creates; deleted when it ends (inside the hold)."""
    ids: list[str] = []
    try:
        yield ids
    finally:
        for certificate_id in ids:
            await certificates.delete(db, certificate_id)


@pytest.fixture
async def acme(deployment: Deployment, db: asyncpg.Pool) -> AcmeActivities:
    issuer = deployment.pebble.issuer()
    account = await ensure_account(db, issuer, None, deployment.encryption_key)
    metrics = CertflowMetrics()
    issuers = IssuerRouter(
        AcmeClients(account, issuer), db, deployment.encryption_key, KeyType.EC256,
        ThreadPoolExecutor(max_workers=4), metrics,
    )
    return AcmeActivities(issuers, db, metrics)


async def _ready_order(
    acme: AcmeActivities, db: asyncpg.Pool, deployment: Deployment, planted: list[str]
) -> tuple[str, str]:
    """Drive a real order to `ready`; the deployment's responder answers the CA."""
    hostname = deployment.hostname("finalized")
    record = await certificates.ensure_certificate(db, hostname, None, None)
    planted.append(record.certificate_id)
    order = await as_temporal_runs(acme.create_order, CreateOrderInput(hostname=hostname))
    assert await as_temporal_runs(
        acme_persist(db), PersistChallengeInput(certificate_id=record.certificate_id, order=order)
    )
    await as_temporal_runs(acme.accept_challenge, AcceptChallengeInput(challenge_url=order.challenge_url))
    progress = await as_temporal_runs(
        acme.wait_for_order,
        WaitForOrderInput(order_url=order.order_url, challenge_url=order.challenge_url, within_seconds=20),
    )
    assert progress.status == "ready"
    return record.certificate_id, order.order_url


def acme_persist(db: asyncpg.Pool):  # type: ignore[no-untyped-def]
    async def persist(input: PersistChallengeInput) -> bool:
        row = await certificates.persist_challenge(db, input.certificate_id, input.order)
        return row is not None

    return persist


def _finalize_out_of_band(acme: AcmeActivities, order_url: str, csr: bytes) -> None:
    """What a worker did before it died: the finalize request, never the store."""
    clients = acme._issuers.at(None).ca.clients
    with clients.borrow() as client:
        body = client.net.post(order_url, None, new_nonce_url=clients.new_nonce_url).json()
        request = messages.CertificateRequest(csr=x509.load_pem_x509_csr(csr))
        client.net.post(body["finalize"], request, new_nonce_url=clients.new_nonce_url)


async def test_valid_order_is_paired_with_the_key_stored_before_finalize(
    acme: AcmeActivities, db: asyncpg.Pool, deployment: Deployment, planted: list[str]
) -> None:
    """The state a worker killed after finalize leaves (key stored, order finalized,
    nothing stored): planted here by hand, then one ``finalize_and_store``."""
    certificate_id, order_url = await _ready_order(acme, db, deployment, planted)
    hostname = await db.fetchval("SELECT hostname::text FROM certificates WHERE id = $1::uuid", certificate_id)
    key = generate_private_key(KeyType.EC256)
    assert await issued_rows.store_pending_key(
        db, certificate_id, order_url, deployment.encryption_key.encrypt(private_key_to_pem(key))
    )
    await asyncio.to_thread(_finalize_out_of_band, acme, order_url, make_csr(key, hostname))

    result = await as_temporal_runs(
        acme.finalize_and_store,
        FinalizeInput(certificate_id=certificate_id, hostname=hostname, order_url=order_url),
    )

    row = await db.fetchrow("SELECT * FROM certificates WHERE id = $1::uuid", certificate_id)
    assert row["status"] == "ACTIVE" and row["ssl_serial"] == result.serial_hex
    stored = load_private_key(deployment.encryption_key.decrypt(bytes(row["encrypted_ssl_private_key"])))
    assert public_key_matches(row["ssl_certificate"], stored)
    assert public_key_matches(row["ssl_certificate"], key)  # the very key stored before finalize
    assert row["pending_private_key"] is None and row["http_order_url"] is None


async def test_retried_finalize_reuses_the_stored_key(
    acme: AcmeActivities, db: asyncpg.Pool, deployment: Deployment, planted: list[str]
) -> None:
    """An activity retried after its key was stored (crash during finalize) keeps that key."""
    certificate_id, order_url = await _ready_order(acme, db, deployment, planted)
    hostname = await db.fetchval("SELECT hostname::text FROM certificates WHERE id = $1::uuid", certificate_id)
    key = generate_private_key(KeyType.EC256)
    await issued_rows.store_pending_key(
        db, certificate_id, order_url, deployment.encryption_key.encrypt(private_key_to_pem(key))
    )
    # The order is still `ready`: finalize_and_store must use the stored key, not a new one.
    await as_temporal_runs(
        acme.finalize_and_store,
        FinalizeInput(certificate_id=certificate_id, hostname=hostname, order_url=order_url),
    )
    leaf = await db.fetchval("SELECT ssl_certificate FROM certificates WHERE id = $1::uuid", certificate_id)
    assert public_key_matches(leaf, key)
    # Storing again (a retry after the commit) is a no-op success, not an error.
    again = await as_temporal_runs(
        acme.finalize_and_store,
        FinalizeInput(certificate_id=certificate_id, hostname=hostname, order_url=order_url),
    )
    assert x509.load_pem_x509_certificate(leaf.encode()).serial_number == int(again.serial_hex, 16)


async def test_a_retried_place_order_returns_the_order_it_stored(
    acme: AcmeActivities, db: asyncpg.Pool, deployment: Deployment, planted: list[str]
) -> None:
    """docs/guarantees.md, "No order wasted" (orders are not idempotent): a try of place_order committed the challenge,
    then its result was lost (a crash). The retry returns that order instead of opening
    another, and the order still validates."""
    hostname = deployment.hostname("placed")
    record = await certificates.ensure_certificate(db, hostname, None, None)
    planted.append(record.certificate_id)
    placing = PlaceOrderInput(certificate_id=record.certificate_id, hostname=hostname)
    first = await as_temporal_runs(acme.place_order, placing)
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    again = await retry.run(acme.place_order, placing)
    assert again.model_dump(exclude={"authorization_url"}) == first.model_dump(
        exclude={"authorization_url"}
    )
    stored = await db.fetchval(
        "SELECT http_order_url FROM certificates WHERE id = $1::uuid", record.certificate_id
    )
    assert stored == first.order_url
    progress = await as_temporal_runs(
        acme.wait_for_order,
        WaitForOrderInput(
            order_url=first.order_url,
            challenge_url=first.challenge_url,
            within_seconds=20,
            accept_first=True,
        ),
    )
    assert progress.status == "ready"
