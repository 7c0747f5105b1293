"""A TSIG key (RFC 8945) for the signed updates of certflow/dns/dns01.py, as knotc
and nsupdate write one: ``name:algorithm:base64-secret``."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import dns.tsig

from certflow.dns.lookup import canonical

TSIG_ALGORITHMS = {
    "hmac-sha256": dns.tsig.HMAC_SHA256,
    "hmac-sha384": dns.tsig.HMAC_SHA384,
    "hmac-sha512": dns.tsig.HMAC_SHA512,
}


@dataclass(frozen=True)
class TsigKey:
    """A TSIG key: its name, algorithm and secret (``name:algorithm:base64``)."""

    name: str
    algorithm: str
    secret: bytes

    def __repr__(self) -> str:
        return f"TsigKey({self.name!r}, {self.algorithm!r}, <secret>)"

    @classmethod
    def parse(cls, text: str) -> TsigKey:
        """``name:algorithm:base64-secret``, as knotc and nsupdate write keys;
        ValueError (never quoting the secret) when it is not one."""
        parts = text.strip().split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError("expected name:algorithm:base64-secret")
        name, algorithm, secret = parts
        if algorithm.lower() not in TSIG_ALGORITHMS:
            known = ", ".join(TSIG_ALGORITHMS)
            raise ValueError(f"algorithm {algorithm!r} is not one of {known}")
        try:
            raw = base64.b64decode(secret, validate=True)
        except binascii.Error:
            raise ValueError("the secret is not base64") from None
        if len(raw) < 16:
            raise ValueError("the secret is shorter than 16 bytes")
        return cls(canonical(name), algorithm.lower(), raw)
