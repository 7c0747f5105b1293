"""Re-encrypting stored private keys under the current CERTFLOW_ENCRYPTION_KEY.

Workers keep running: each batch is its own short transaction over a few rows,
and every value still decrypts with either key while the rotation runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from certflow.crypto import EncryptionKey

BATCH_SIZE = 100
_COLUMNS = {
    "certificates": ("id", ("encrypted_ssl_private_key", "pending_private_key")),
    "acme_accounts": ("directory_url", ("encrypted_account_key",)),
}


@dataclass
class RotationReport:
    examined: int = 0
    reencrypted: int = 0


async def rotate_keys(
    pool: asyncpg.Pool, key: EncryptionKey, batch_size: int = BATCH_SIZE
) -> RotationReport:
    """Re-encrypt every value an old key wrote; values under the current key stay."""
    report = RotationReport()
    for table, (id_column, columns) in _COLUMNS.items():
        last: object = None
        while True:
            async with pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(
                    f"SELECT {id_column} AS id, {', '.join(columns)} FROM {table}"
                    f" WHERE $1::text IS NULL OR {id_column}::text > $1::text"
                    f" ORDER BY {id_column}::text LIMIT $2 FOR UPDATE",
                    None if last is None else str(last),
                    batch_size,
                )
                for row in rows:
                    report.examined += 1
                    for column in columns:
                        blob = row[column]
                        if blob is None:
                            continue
                        plaintext, current = key.decrypt_with_origin(bytes(blob))
                        if current:
                            continue
                        await conn.execute(
                            f"UPDATE {table} SET {column} = $2 WHERE {id_column} = $1",
                            row["id"],
                            key.encrypt(plaintext),
                        )
                        report.reencrypted += 1
            if len(rows) < batch_size:
                break
            last = rows[-1]["id"]
    return report
