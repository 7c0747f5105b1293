"""The CNAME a customer's hostname must have: a chain, followed one lookup at a
time, that reaches the edge's name."""

from __future__ import annotations

from certflow.dns.lookup import CnameLookup, DnsLookupError, canonical as _canonical, unique as _unique
from certflow.errors import DnsCheckError, ErrorCode

CNAME_MAX_LOOKUPS = 4


async def follow_cname_chain(hostname: str, target: str, lookup: CnameLookup) -> None:
    """Raise ``DnsCheckError(DNS_CNAME)`` unless ``hostname`` aliases ``target``.

    Follows the chain one CNAME lookup at a time, at most
    :data:`CNAME_MAX_LOOKUPS` lookups. Fails on: no CNAME at the hostname, a
    chain ending at another name, a loop, a chain that is too long, several
    CNAMEs for one owner, an answer owned by a name other than the one asked,
    and lookup errors. ``found`` lists the aliases seen (or the offending
    records); ``expected`` is the target.
    """
    start = _canonical(hostname)
    expected = _canonical(target)
    chain: list[str] = []
    seen = {start}
    current = start

    def fail(message: str, found: list[str] | None = None) -> DnsCheckError:
        return DnsCheckError(
            ErrorCode.DNS_CNAME,
            message,
            found=list(chain) if found is None else found,
            expected=expected,
        )

    for _ in range(CNAME_MAX_LOOKUPS):
        try:
            answers = await lookup(current)
        except DnsLookupError as exc:
            raise fail(f"could not look up the CNAME record of {current}: {exc.reason}") from exc

        if not answers:
            if not chain:
                raise fail(f"{start} has no CNAME record; expected a CNAME to {expected}")
            raise fail(f"{start} is a CNAME to {' -> '.join(chain)}; expected {expected}")

        foreign = [a for a in answers if _canonical(a.owner) != current]
        if foreign:
            raise fail(
                f"the CNAME answer for {current} is owned by {_canonical(foreign[0].owner)}; "
                f"expected a record owned by {current}",
                found=[f"{_canonical(a.owner)} CNAME {_canonical(a.target)}" for a in answers],
            )

        targets = _unique(_canonical(a.target) for a in answers)
        if len(targets) > 1:
            raise fail(
                f"{current} has {len(targets)} CNAME records ({', '.join(targets)}); "
                f"expected exactly one, to {expected}",
                found=targets,
            )

        current = targets[0]
        chain.append(current)
        if current == expected:
            return
        if current in seen:
            raise fail(f"{start} has a CNAME loop: {' -> '.join([start, *chain])}")
        seen.add(current)

    raise fail(
        f"{start} has a CNAME chain longer than {CNAME_MAX_LOOKUPS} lookups "
        f"({' -> '.join([start, *chain])} -> ...) that does not reach {expected}"
    )
