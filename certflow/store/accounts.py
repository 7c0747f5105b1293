"""ACME accounts in Postgres: one per directory URL, the key stored encrypted.

Workers that start together serialize on a per-directory advisory lock held for
the transaction, so exactly one of them generates and registers the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

REPLACES_ASKED_AGAIN_AFTER = "1 day"
"""A CA that rejected ``replaces`` itself is sent it again after this long."""


@dataclass(frozen=True)
class StoredAccount:
    account_url: str
    encrypted_key: bytes
    replaces_refused_until: datetime | None = None


async def lock_directory(conn: asyncpg.Connection, directory_url: str) -> None:
    """Hold this directory's account lock until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", directory_url)


async def stored_account(conn: asyncpg.Connection, directory_url: str) -> StoredAccount | None:
    row = await conn.fetchrow(
        "SELECT account_url, encrypted_account_key, replaces_refused_until FROM acme_accounts"
        " WHERE directory_url = $1",
        directory_url,
    )
    if row is None:
        return None
    return StoredAccount(
        row["account_url"], bytes(row["encrypted_account_key"]), row["replaces_refused_until"]
    )


async def save_account(
    conn: asyncpg.Connection, directory_url: str, account_url: str, encrypted_key: bytes
) -> None:
    """Insert the account, or record the URL the CA now gives the same key."""
    await conn.execute(
        """INSERT INTO acme_accounts (directory_url, account_url, encrypted_account_key)
           VALUES ($1, $2, $3)
           ON CONFLICT (directory_url) DO UPDATE SET account_url = EXCLUDED.account_url""",
        directory_url,
        account_url,
        encrypted_key,
    )


async def refuse_replaces(pool: asyncpg.Pool, directory_url: str) -> datetime:
    """Remember that this CA rejects RFC 9773 ``replaces`` itself: renewals go without
    it until the returned time, then it is sent again."""
    until: datetime = await pool.fetchval(
        f"""UPDATE acme_accounts SET replaces_refused_until = now() + interval '{REPLACES_ASKED_AGAIN_AFTER}'
            WHERE directory_url = $1 RETURNING replaces_refused_until""",
        directory_url,
    )
    return until
