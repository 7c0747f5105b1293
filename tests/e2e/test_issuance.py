"""End to end: a worker process, real Postgres, Temporal dev server, Pebble and challtestsrv."""

from __future__ import annotations

import asyncio
import collections
import time

import asyncpg
import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from certflow.crypto import PrivateKey, load_private_key, public_key_matches
from certflow.product.client import CertflowClient
from certflow.contract import reconcile_schedule_id
from devstack import servers
from tests.e2e.conftest import Deployment
from tests.leaks import all_leaks, key_needles

pytestmark = pytest.mark.e2e

WAIT = 60.0


async def _row(db: asyncpg.Pool, hostname: str) -> asyncpg.Record:
    row = await db.fetchrow("SELECT * FROM certificates WHERE hostname = $1", hostname)
    assert row is not None, f"no row for {hostname}"
    return row


def _verify_chain(leaf_pem: str, chain_pem: str, root_pem: str, hostname: str) -> None:
    root = x509.load_pem_x509_certificate(root_pem.encode())
    leaf = x509.load_pem_x509_certificate(leaf_pem.encode())
    intermediates = x509.load_pem_x509_certificates(chain_pem.encode()) if chain_pem else []
    verifier = PolicyBuilder().store(Store([root])).build_server_verifier(x509.DNSName(hostname))
    verifier.verify(leaf, intermediates)  # raises VerificationError when it does not chain


async def _wait_for(
    client: CertflowClient, hostname: str, predicate: object, timeout: float = WAIT
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        report = await client.status(hostname)
        if report is not None and predicate(report):  # type: ignore[operator]
            return report
        if time.monotonic() > deadline:
            raise AssertionError(f"{hostname}: condition not reached; last status {report}")
        await asyncio.sleep(0.1)


async def test_three_hostnames_become_active_with_verified_chains_and_matching_keys(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    hostnames = [deployment.hostname(label) for label in ("shop", "trust", "www")]
    await client.request(hostnames, tenant_id="tenant-1")
    reports = await client.wait(hostnames, WAIT)
    assert {h: r.status if r else None for h, r in reports.items()} == dict.fromkeys(
        hostnames, "ACTIVE"
    )
    root_pem = deployment.pebble.root_pem()
    for hostname in hostnames:
        row = await _row(db, hostname)
        assert row["tenant_id"] == "tenant-1"
        assert row["http_order_url"] is None and row["http_challenge_token"] is None
        assert row["pending_private_key"] is None
        _verify_chain(row["ssl_certificate"], row["ssl_certificate_chain"], root_pem, hostname)
        key = load_private_key(deployment.encryption_key.decrypt(bytes(row["encrypted_ssl_private_key"])))
        assert public_key_matches(row["ssl_certificate"], key)
        leaf = x509.load_pem_x509_certificate(row["ssl_certificate"].encode())
        assert leaf.not_valid_after_utc == row["ssl_expires_at"]


async def test_requesting_again_reuses_the_running_workflow(
    deployment: Deployment, client: CertflowClient
) -> None:
    hostname = deployment.bare_hostname("again")  # no CNAME: the workflow keeps running
    await client.request([hostname])
    first = await client.handle(hostname).describe()
    await client.request([hostname.upper() + "."])
    second = await client.handle(hostname).describe()
    assert first.run_id == second.run_id


async def test_missing_cname_waits_pending_then_issues_once_fixed(
    deployment: Deployment, client: CertflowClient
) -> None:
    hostname = deployment.bare_hostname("nocname")
    await client.request([hostname])
    report = await _wait_for(client, hostname, lambda r: r.error_code == "DNS_CNAME")
    assert report.status == "PENDING"  # type: ignore[attr-defined]
    assert "has no CNAME" in report.error_message  # type: ignore[attr-defined]
    assert report.retry_count == 0  # type: ignore[attr-defined]

    deployment.pebble.set_cname(hostname, "elsewhere.other.test")
    report = await _wait_for(
        client, hostname, lambda r: "elsewhere.other.test" in (r.error_message or "")
    )
    assert report.status == "PENDING"  # type: ignore[attr-defined]

    deployment.pebble.set_cname(hostname, "edge.saas.test")
    report = await _wait_for(client, hostname, lambda r: r.status == "ACTIVE")
    assert report.error_code is None  # type: ignore[attr-defined]


async def test_caa_naming_another_ca_is_dns_caa(
    deployment: Deployment, client: CertflowClient
) -> None:
    hostname = deployment.hostname("caa")
    # The customer's zone apex carries the CAA set (the hostname itself is a CNAME).
    deployment.pebble.add_caa(hostname.split(".", 1)[1], [("issue", "other-ca.example")])
    await client.request([hostname])
    report = await _wait_for(client, hostname, lambda r: r.error_code is not None)
    assert report.error_code == "DNS_CAA"  # type: ignore[attr-defined]
    assert report.status == "PENDING"  # type: ignore[attr-defined]
    assert "other-ca.example" in report.error_message  # type: ignore[attr-defined]


async def test_no_key_material_in_workflows_tables_or_logs(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    """docs/guarantees.md: no plaintext private key in Postgres, in any Temporal
    payload or history (decoded), or in the worker's log. tests/leaks.py searches
    every run of every workflow in the namespace (children and continue-as-new runs
    followed), the reconcile schedule, every table and the whole worker log, for
    every key the deployment holds and every key its worker generated (captured at
    generation: a key made, used and replaced is searched for too), and for private
    keys by their structure whatever key they are; tests/e2e/test_leak_detector.py
    proves that search finds planted keys in each place and encoding."""
    hostnames = [deployment.hostname("secret"), deployment.hostname("secret")]
    await client.request(hostnames)
    for hostname in hostnames:
        await _wait_for(client, hostname, lambda r: r.status == "ACTIVE")
    workflow_ids = [client.handle(hostname).id for hostname in hostnames]
    query = " OR ".join(f'WorkflowId = "{workflow_id}"' for workflow_id in workflow_ids)
    # After the issuance the run that issued waits for the renewal (or the run it
    # continued as new into does): wait for that wait, so the search covers the
    # issuance's payloads and what follows it.
    for hostname in hostnames:
        await _wait_for(client, hostname, lambda r: r.phase == "active; waiting for the renewal time")
    deadline = time.monotonic() + WAIT
    while True:
        listed = collections.Counter([e.id async for e in client.temporal.list_workflows(query)])
        if all(listed[workflow_id] >= 1 for workflow_id in workflow_ids):
            break
        assert time.monotonic() < deadline, f"runs listed: {dict(listed)}"
        await asyncio.sleep(0.1)

    keys: list[PrivateKey] = []
    for row in await db.fetch("SELECT hostname::text AS hostname, encrypted_ssl_private_key,"
                              " pending_private_key FROM certificates"):
        for column in ("encrypted_ssl_private_key", "pending_private_key"):
            if row[column] is not None:
                keys.append(load_private_key(deployment.encryption_key.decrypt(bytes(row[column]))))
        if row["hostname"] in hostnames:
            assert row["encrypted_ssl_private_key"] is not None
    accounts = await db.fetch("SELECT encrypted_account_key FROM acme_accounts")
    assert accounts
    keys += [
        load_private_key(deployment.encryption_key.decrypt(bytes(a["encrypted_account_key"])))
        for a in accounts
    ]

    generated = servers.captured_keys(deployment.key_capture)
    assert len(generated) >= 2 * len(hostnames), "the worker's generated keys were not captured"
    findings = await all_leaks(
        key_needles(*keys, *generated),
        client=client.temporal,
        query=None,  # the whole namespace, not only these certificates' workflows
        schedule_ids=[reconcile_schedule_id(client.task_queue)],
        database=db,
        logs=[deployment.worker.log],
    )
    print(f"\nleak search: {findings.summary()}")
    assert not findings, "\n".join(findings[:20])
    certificate_runs = {run for workflow_id, run in findings.runs if workflow_id in workflow_ids}
    assert len(certificate_runs) >= len(hostnames), findings.summary()
    for workflow_id in workflow_ids:
        assert {run for w, run in findings.runs if w == workflow_id}, findings.runs
    assert findings.payloads >= len(certificate_runs), findings.summary()
    assert {"public.certificates", "public.acme_accounts", "public.certificate_events"} <= findings.tables
    assert findings.rows >= len(hostnames) and findings.lines > 0, findings.summary()
