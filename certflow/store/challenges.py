"""What the HTTP-01 responder answers: the open challenges' key
authorizations, and the probes of ``check``; which dns-01 TXT values are in use."""

from __future__ import annotations

from dataclasses import dataclass

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

@dataclass(frozen=True)
class LabelUse:
    """What Postgres says of the rows sharing one dns-01 label (a name and its
    wildcard): which TXT values are in use there, and whether one of those rows
    finished a dns-01 attempt a moment ago (so the CA may have read the label)."""

    key_authorizations: list[str]
    """Those of the rows' open orders: a TXT value at the label is in use while it
    is the digest of one of them (certflow/dns/dns01.py)."""
    finished_lately: bool
    """A row without an open order whose last order was dns-01, written to within
    the given seconds (its order cleared once valid or abandoned, as a rule)."""


async def label_use(pool: asyncpg.Pool, hostnames: tuple[str, str], within_seconds: float) -> LabelUse:
    """:class:`LabelUse` of the rows of ``hostnames`` (one statement)."""
    rows = await pool.fetch(
        """
        SELECT http_challenge_key_auth,
               http_challenge_key_auth IS NULL AND validation_method = 'dns-01'
                   AND updated_at > now() - make_interval(secs => $3) AS finished_lately
        FROM certificates WHERE hostname = $1 OR hostname = $2
        """,
        *hostnames,
        within_seconds,
    )
    return LabelUse(
        key_authorizations=[
            str(row["http_challenge_key_auth"]) for row in rows if row["http_challenge_key_auth"] is not None
        ],
        finished_lately=any(row["finished_lately"] for row in rows),
    )
