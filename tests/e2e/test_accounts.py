"""One ACME account per directory URL: generated once, stored encrypted, shared by
every worker, and registered again when the CA forgot it (docs/guarantees.md).

Checked: with the per-directory advisory lock taken out of ``ensure_account``,
workers starting together each generated a key; the first test then saw more
than one account URL in the workers' logs.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest

from devstack import servers

pytestmark = pytest.mark.e2e

WORKERS = 3


def _account_urls(log: Path) -> set[str]:
    found = set()
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("message") == "ACME account ready":
            found.add(str(entry["account_url"]))
    return found


async def test_workers_share_one_account_and_register_it_again_when_the_ca_forgot(
    temporal: servers.TemporalDevServer,
    new_database: Callable[..., str],
    tmp_path: Path,
) -> None:
    database_url = new_database("certflow_accounts")
    pebble = servers.start_pebble(tmp_path / "pebble", nonce_reject_percent=0)
    env = servers.certflow_environment(
        pebble=pebble,
        temporal_address=temporal.address,
        database_url=database_url,
        encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
        cname_target="edge.accounts.test",
        task_queue=f"certflow-accounts-{uuid.uuid4().hex[:6]}",
        extra={"CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0", "CERTFLOW_RENEWAL_INFO_SWEEP_SECONDS": "0"},
    )
    port = pebble.http01_port
    workers: list[servers.WorkerProcess] = []
    failures: list[BaseException] = []

    def start(n: int) -> None:
        try:
            workers.append(
                servers.start_worker(
                    tmp_path / f"w{n}",
                    {**env, "CERTFLOW_HTTP01_LISTEN": f"127.0.0.{20 + n}:{port}"},
                    name=f"worker-{n}",
                )
            )
        except BaseException as err:  # reported below
            failures.append(err)

    try:
        # Started together: they race for the account.
        threads = [threading.Thread(target=start, args=(n,)) for n in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch("SELECT * FROM acme_accounts")
            assert len(rows) == 1, rows
            (row,) = rows
            assert row["directory_url"] == pebble.directory_url
            urls = set().union(*(_account_urls(w.log) for w in workers))
            assert urls == {row["account_url"]}, urls  # every worker signs as the one account
            first_url, sealed = row["account_url"], bytes(row["encrypted_account_key"])
            assert b"PRIVATE KEY" not in sealed

            # The CA forgets every account (a new Pebble on the same address): the next
            # worker registers the same key again and records its new URL.
            for worker in workers:
                worker.stop()
            workers.clear()
            directory_port = int(pebble.directory_url.rsplit(":", 1)[1].split("/", 1)[0])
            pebble.stop()
            pebble = servers.start_pebble(
                tmp_path / "pebble-again", nonce_reject_percent=0, ca_port=directory_port
            )
            env = {
                **env,
                "CERTFLOW_ACME_CA_BUNDLE": str(pebble.ca_bundle),
                "CERTFLOW_DNS_RESOLVER": pebble.dns_resolver,
                "CERTFLOW_HTTP01_LISTEN": f"127.0.0.1:{pebble.http01_port}",
                "CERTFLOW_HTTP01_SELF_CHECK_PORT": str(pebble.http01_port),
            }
            assert pebble.directory_url == env["CERTFLOW_ACME_DIRECTORY_URL"]
            workers.append(servers.start_worker(tmp_path / "w-again", env, name="worker-again"))
            row = await conn.fetchrow("SELECT * FROM acme_accounts")
            assert row["account_url"] != first_url  # registered again at the new CA
            assert bytes(row["encrypted_account_key"]) == sealed  # with the same key
            assert _account_urls(workers[0].log) == {row["account_url"]}
        finally:
            await conn.close()
    finally:
        for worker in workers:
            worker.stop()
        pebble.stop()
