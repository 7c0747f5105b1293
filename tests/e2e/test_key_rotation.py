"""Encryption key rotation: old keys still decrypt, new writes use the new key,
`starter.py rotate-keys` re-encrypts everything in batches."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest

from certflow.crypto import DecryptionError, EncryptionKey, generate_private_key, private_key_to_pem
from certflow.store.db import create_pool, migrate
from certflow.store.rotation import rotate_keys
from certflow.crypto import KeyType

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


async def _seed(pool: asyncpg.Pool, key: EncryptionKey, count: int) -> dict[str, bytes]:
    plaintexts = {}
    for i in range(count):
        pem = private_key_to_pem(generate_private_key(KeyType.EC256))  # made here, never checked in
        hostname = f"rot{i}.rotation.test"
        await pool.execute(
            "INSERT INTO certificates (hostname, status, encrypted_ssl_private_key, ssl_certificate)"
            " VALUES ($1, 'ACTIVE', $2, 'leaf')",
            hostname,
            key.encrypt(pem),
        )
        plaintexts[hostname] = pem
    await pool.execute(
        "INSERT INTO acme_accounts (directory_url, account_url, encrypted_account_key)"
        " VALUES ('https://ca.test/dir', 'https://ca.test/acct/1', $1)",
        key.encrypt(b"account key"),
    )
    return plaintexts


async def test_rotate_keys_reencrypts_everything(new_database: Callable[[], str]) -> None:
    url = new_database()
    pool = await create_pool(url, max_size=2)
    try:
        await migrate(pool)
        old, new = secrets.token_bytes(32), secrets.token_bytes(32)
        plaintexts = await _seed(pool, EncryptionKey(old), 250)  # more than one batch

        during = EncryptionKey(new, [old])
        blob = await pool.fetchval(
            "SELECT encrypted_ssl_private_key FROM certificates WHERE hostname = 'rot0.rotation.test'"
        )
        assert during.decrypt(bytes(blob)) == plaintexts["rot0.rotation.test"]  # old still reads
        assert during.decrypt_with_origin(during.encrypt(b"x"))[1]  # new writes use the new key

        env = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
        env |= {
            "CERTFLOW_DATABASE_URL": url,
            "CERTFLOW_ENCRYPTION_KEY": _b64(new),
            "CERTFLOW_ENCRYPTION_KEYS_OLD": _b64(secrets.token_bytes(32)) + "," + _b64(old),
        }
        result = subprocess.run(
            [sys.executable, "starter.py", "rotate-keys"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "examined 251 rows; re-encrypted 251 values" in result.stdout

        only_new = EncryptionKey(new)
        rows = await pool.fetch("SELECT hostname::text, encrypted_ssl_private_key FROM certificates")
        for row in rows:
            assert only_new.decrypt(bytes(row["encrypted_ssl_private_key"])) == plaintexts[row["hostname"]]
            with pytest.raises(DecryptionError):
                EncryptionKey(old).decrypt(bytes(row["encrypted_ssl_private_key"]))
        account = await pool.fetchval("SELECT encrypted_account_key FROM acme_accounts")
        assert only_new.decrypt(bytes(account)) == b"account key"

        again = await rotate_keys(pool, EncryptionKey(new, [old]))
        assert again.reencrypted == 0  # idempotent
    finally:
        await pool.close()


async def test_wrong_key_changes_nothing(new_database: Callable[[], str]) -> None:
    url = new_database()
    pool = await create_pool(url, max_size=2)
    try:
        await migrate(pool)
        real = secrets.token_bytes(32)
        await _seed(pool, EncryptionKey(real), 3)
        before = await pool.fetch("SELECT * FROM certificates ORDER BY hostname")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
        env |= {"CERTFLOW_DATABASE_URL": url, "CERTFLOW_ENCRYPTION_KEY": _b64(secrets.token_bytes(32))}
        result = subprocess.run(
            [sys.executable, "starter.py", "rotate-keys"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 1
        assert "does not decrypt" in result.stderr
        after = await pool.fetch("SELECT * FROM certificates ORDER BY hostname")
        assert [dict(r) for r in after] == [dict(r) for r in before]
    finally:
        await pool.close()
