"""Proof that the tenant asking owns the hostname: a TXT only its owner can add.

For (tenant, hostname) the token is an HMAC under ``OWNERSHIP_SECRET`` — stable,
derived again whenever needed, nothing stored — and the customer adds
``_certflow.<host> TXT "<token>"``. With ``REQUIRE_OWNERSHIP`` no order is placed
for a hostname until the record of the row's tenant is seen through the resolver,
and a transfer to another tenant needs that tenant's record. A dangling CNAME of a
customer who left does not let the next tenant who types the name get a
certificate for it: the new tenant's token is not there.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence

from certflow.dns.dns01 import base_name
from certflow.dns.lookup import DnsLookupError
from certflow.errors import DnsCheckError, ErrorCode
from certflow.models import DnsRecord

OWNERSHIP_LABEL = "_certflow"


def ownership_token(secret: bytes, tenant_id: str | None, hostname: str) -> str:
    """The token of (tenant, hostname): 160 bits of HMAC-SHA256, base32."""
    message = b"certflow-ownership\0" + (tenant_id or "").encode() + b"\0" + base_name(hostname).encode()
    digest = hmac.new(secret, message, hashlib.sha256).digest()[:20]
    return base64.b32encode(digest).decode().lower()


def ownership_record(secret: bytes, tenant_id: str | None, hostname: str) -> DnsRecord:
    """The record that proves ``tenant_id`` owns ``hostname`` (a wildcard: its base)."""
    return DnsRecord(
        name=f"{OWNERSHIP_LABEL}.{base_name(hostname)}",
        type="TXT",
        value=ownership_token(secret, tenant_id, hostname),
    )


async def check_ownership(
    hostname: str,
    tenant_id: str | None,
    secret: bytes,
    lookup_txt: Callable[[str], Awaitable[Sequence[str]]],
) -> str:
    """Raise ``DnsCheckError(OWNERSHIP_UNVERIFIED)`` unless the tenant's record is seen;
    what was found when it is."""
    record = ownership_record(secret, tenant_id, hostname)
    try:
        found = list(await lookup_txt(record.name))
    except DnsLookupError as err:
        raise DnsCheckError(
            ErrorCode.OWNERSHIP_UNVERIFIED,
            f"could not look up the TXT records of {record.name}: {err.reason}",
            expected=record.value,
        ) from err
    if record.value in found:
        return f"{record.name} proves the tenant owns {base_name(hostname)}"
    seen = f" (it has {len(found)} other TXT record{'s' if len(found) != 1 else ''})" if found else ""
    raise DnsCheckError(
        ErrorCode.OWNERSHIP_UNVERIFIED,
        f"ownership of {base_name(hostname)} is not proven yet{seen}: add {record.name} TXT \"{record.value}\"",
        found=found,
        expected=record.value,
    )
