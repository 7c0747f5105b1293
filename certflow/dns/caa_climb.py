"""Which CAA RRset decides for a hostname (RFC 8659 §3, as Boulder's ``va/caa.go``
finds it).

The relevant RRset of a name is the CAA records in the answer to a CAA query for
it, the resolver following CNAMEs, for the hostname and then each of *its*
parents up to the TLD; the first non-empty set decides. The climb
(:func:`find_caa_set`) is separate from the verdict (``caa_verdict``), so one
climb can be judged for several CAs. The lookup is injected: unit-testable
without DNS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from certflow.dns.caa_records import CaaAnswerSet, CaaRecord
from certflow.dns.lookup import DnsLookupError, canonical as _canonical
from certflow.errors import DnsCheckError, ErrorCode

_ARROW = " → "


@dataclass(frozen=True)
class CaaSet:
    """The relevant CAA RRset that decides for ``hostname`` (RFC 8659 §3).

    ``name`` is the name whose CAA query returned it (the hostname or one of its
    parents); ``chain`` is ``name`` followed by each CNAME target up to the
    name owning ``records`` (just ``(name,)`` without an alias).
    """

    hostname: str
    name: str
    chain: tuple[str, ...]
    records: tuple[CaaRecord, ...]

    @property
    def owner(self) -> str:
        """Where the records were found: the end of the alias chain."""
        return self.chain[-1]

    @property
    def location(self) -> str:
        """``CAA at <owner>``, with ``(via a → b)`` when reached through an alias."""
        where = f"CAA at {self.owner}"
        if len(self.chain) > 1:
            where += f" (via {_ARROW.join(self.chain)})"
        return where


CaaLookup = Callable[[str], Awaitable[CaaAnswerSet]]
"""Returns the CNAME and CAA records in the answer to a CAA query for a name."""


def caa_lookup_names(hostname: str) -> list[str]:
    """The names whose CAA RRsets are consulted: the name, then each parent up to the TLD."""
    labels = _canonical(hostname).split(".")
    return [".".join(labels[i:]) for i in range(len(labels)) if labels[i]]


def _relevant_set(hostname: str, name: str, answer: CaaAnswerSet) -> CaaSet | None:
    """The CAA RRset of ``name`` in one answer, its CNAME chain followed; ``None`` if empty.

    The chain starts at ``name`` and follows the answer's CNAME records (the
    first one per owner; a loop ends it). CAA records owned by a name off the
    chain are ignored; the set is owned by the last name of the chain that owns
    any (in valid DNS only the end of the chain can own CAA records).
    """
    targets: dict[str, str] = {}
    for cname in answer.cnames:
        targets.setdefault(_canonical(cname.owner), _canonical(cname.target))
    chain = [name]
    while (target := targets.get(chain[-1])) is not None and target not in chain:
        chain.append(target)
    owned: dict[str, list[CaaRecord]] = {}
    for caa in answer.caa:
        owner = _canonical(caa.owner)
        if owner in chain:
            owned.setdefault(owner, []).append(caa.record)
    if not owned:
        return None
    end = max(chain.index(owner) for owner in owned)
    records = [r for owner in chain[: end + 1] for r in owned.get(owner, [])]
    return CaaSet(hostname, name, tuple(chain[: end + 1]), tuple(records))


async def find_caa_set(hostname: str, lookup: CaaLookup) -> CaaSet | None:
    """The relevant CAA RRset for ``hostname`` (RFC 8659 §3, as Boulder reads it).

    Asks ``lookup`` for the hostname and each of the hostname's own parents up
    to the TLD (never the root, never the alias target's parents), all at once
    as Boulder's VA does (``parallelCAALookup``: an uncached climb costs one
    resolver round trip, not one per label); the first name, from the hostname
    up, whose answer holds CAA records on its CNAME chain decides. An answer
    with only the chain (NODATA at the target) is an empty set: the climb goes
    on. ``None`` when no name has any.

    Raises ``DnsCheckError(ACME_TEMPORARY)`` when a lookup fails (SERVFAIL,
    timeout) below the deciding name: a failed lookup could hide a denying set,
    but it is no denial. A failure above it changes nothing (``selectCAA``).
    Its ``expected`` is empty (no CA is judged here; ``caa_verdict.check_caa`` fills it).
    """
    host = _canonical(hostname)
    names = caa_lookup_names(host)
    answers = await asyncio.gather(*(lookup(name) for name in names), return_exceptions=True)
    for name, answer in zip(names, answers):
        if isinstance(answer, DnsLookupError):
            applies = "" if name == host else f" (applies to {host})"
            raise DnsCheckError(
                ErrorCode.ACME_TEMPORARY,
                f"CAA lookup for {name} failed: {answer.reason}{applies}",
                found=[],
            ) from answer
        if isinstance(answer, BaseException):
            raise answer
        found = _relevant_set(host, name, answer)
        if found is not None:
            return found
    return None


def caa_reading(found: CaaSet | None) -> str:
    """The deciding CAA set as we read it, in one line that changes when the answer
    does (records sorted: the order a resolver lists them in means nothing)."""
    if found is None:
        return "no CAA records up to the TLD"
    return f"{found.location}: " + "; ".join(sorted(r.to_text() for r in found.records))
