"""Expected values the tests compare the product with, computed here from the rules
as docs/lifecycle.md states them — never by calling the product's own functions, so a
wrong product function cannot agree with itself.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta


def certificate_fraction(hostname: str, not_before: datetime) -> float:
    """docs/lifecycle.md "The lifecycle": the point in [0, 1) fixed per certificate by its
    hostname and notBefore — the first 8 bytes of SHA-256 of ``host|notBefore``."""
    digest = hashlib.sha256(f"{hostname}|{not_before.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def renewal_time(
    hostname: str,
    not_before: datetime,
    not_after: datetime,
    window: tuple[datetime, datetime] | None = None,
) -> datetime:
    """When the workflow renews: in the ARI window at the certificate's fraction (a
    window reaching within 2 days of notAfter cut to its first half or 2 days before
    notAfter, whichever is earlier); without one, when 1/3 of the lifetime remains
    (1/2 under 10 days) less up to 10 % of the time before that mark."""
    fraction = certificate_fraction(hostname, not_before)
    if window is not None:
        start, end = window
        if end <= start:
            return start
        if end >= not_after - timedelta(days=2):
            end = max(start, min(start + (end - start) / 2, not_after - timedelta(days=2)))
        return start + (end - start) * fraction
    lifetime = not_after - not_before
    left = lifetime / 2 if lifetime < timedelta(days=10) else lifetime / 3
    mark = not_after - left
    return mark - (mark - not_before) * 0.10 * fraction
