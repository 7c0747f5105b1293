"""What the HTTP-01 responder answers: the open challenges' key
authorizations, and the probes of ``check``."""

from __future__ import annotations


import asyncpg



async def challenge_key_authorization(pool: asyncpg.Pool, token: str, hostname: str) -> str | None:
    """The key authorization of an open challenge (or a live probe of ``check``)
    for this token and hostname."""
    value = await pool.fetchval(
        """
        SELECT http_challenge_key_auth FROM certificates
        WHERE http_challenge_token = $1 AND hostname = $2
          AND coalesce(validation_method, 'http-01') = 'http-01'
        UNION ALL
        SELECT key_authorization FROM http01_probes
        WHERE token = $1 AND hostname = $2 AND expires_at > now()
        LIMIT 1
        """,
        token,
        hostname,
    )
    return str(value) if value is not None else None

async def add_probe(pool: asyncpg.Pool, hostname: str, token: str, key_authorization: str) -> None:
    """A challenge the responder answers for a minute, with no order behind it."""
    await pool.execute(
        "INSERT INTO http01_probes (token, hostname, key_authorization, expires_at)"
        " VALUES ($1, $2, $3, now() + interval '1 minute')",
        token,
        hostname,
        key_authorization,
    )

async def remove_probe(pool: asyncpg.Pool, token: str) -> None:
    """Remove the probe, and any left behind by a check that died mid-way."""
    await pool.execute(
        "DELETE FROM http01_probes WHERE token = $1 OR expires_at < now()", token
    )
