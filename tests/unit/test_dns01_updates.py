"""The RFC 2136 updates certflow sends for dns-01 (certflow/dns/dns01.py), read back
from the messages dnspython builds: a publish adds one TXT RR, a withdraw deletes
one RR per value, and neither ever deletes the RRset, which ``x`` and ``*.x``
share (issue 39). ``publish`` and ``withdraw`` are run against a label kept in
memory that applies those messages as a primary does (prerequisites included); the
same on real Knot is tests/harness/test_dns01zone.py, and the pair through Pebble
tests/e2e/test_dns_validation.py.

Shown red: with the RRset replace put back in ``publish_update``
(``update.delete(owner, "TXT")`` before the add, as before issue 39), 6 of these
11 failed: the three on the message built, and the pair, the leftover and the
race below (the name's value gone once the wildcard published); with
``delete_update`` deleting the RRset (the old withdraw), 3 failed: the message
built, the pair and ``test_a_withdraw_leaves_the_other_rows_value``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

import dns.rdataclass
import dns.rdatatype
import dns.rrset
import dns.update
import pytest

from certflow.dns.tsig import TsigKey
from certflow.dns import dns01

KEY = TsigKey("k", "hmac-sha256", b"x" * 32)
ZONE = dns01.Dns01Zone(zone="acme.saas.test", primary="127.0.0.1:53", key=KEY)
HOST, WILDCARD = "shop.customer.test", "*.shop.customer.test"
OWNER = dns01.delegation_label(HOST)


def _values(rrset: dns.rrset.RRset) -> list[str]:
    return [b"".join(rdata.strings).decode() for rdata in rrset]


def _changes(update: dns.update.UpdateMessage) -> list[tuple[str, str, list[str]]]:
    """Each RR of the update section: (what it does, owner, its values)."""
    kinds = {None: "add", dns.rdataclass.NONE: "delete-rr", dns.rdataclass.ANY: "delete-rrset"}
    return [
        (kinds[rrset.deleting], rrset.name.to_text(), _values(rrset)) for rrset in update.update
    ]


def _never_an_rrset_delete(update: dns.update.UpdateMessage) -> None:
    assert all(rrset.deleting != dns.rdataclass.ANY for rrset in update.update), update.to_text()
    assert all(rrset.rdtype == dns.rdatatype.TXT for rrset in update.update), update.to_text()


def test_a_publish_adds_one_rr_and_deletes_no_rrset() -> None:
    update = dns01.publish_update(ZONE, HOST, "mine", ["theirs"])
    assert _changes(update) == [("add", OWNER, ["mine"])]
    assert [rrset.ttl for rrset in update.update] == [dns01.TXT_TTL]
    _never_an_rrset_delete(update)
    # Only if the label still holds exactly what was read (RFC 2136 §2.4.2).
    [prerequisite] = update.prerequisite
    assert prerequisite.rdclass == dns.rdataclass.IN and _values(prerequisite) == ["theirs"]


def test_a_publish_to_an_empty_label_requires_it_still_empty() -> None:
    update = dns01.publish_update(ZONE, HOST, "mine", [])
    assert _changes(update) == [("add", OWNER, ["mine"])]
    [prerequisite] = update.prerequisite
    assert (prerequisite.rdclass, prerequisite.rdtype) == (dns.rdataclass.NONE, dns.rdatatype.TXT)


def test_leftovers_go_one_rr_each_in_the_same_update() -> None:
    update = dns01.publish_update(ZONE, HOST, "mine", ["theirs", "old"], ["old"])
    assert _changes(update) == [("delete-rr", OWNER, ["old"]), ("add", OWNER, ["mine"])]
    _never_an_rrset_delete(update)


def test_a_withdraw_deletes_one_rr_per_value() -> None:
    update = dns01.delete_update(ZONE, HOST, ["done", "older"])
    assert _changes(update) == [("delete-rr", OWNER, ["done"]), ("delete-rr", OWNER, ["older"])]
    assert not update.prerequisite
    _never_an_rrset_delete(update)


def test_leftovers_are_the_values_no_open_order_uses() -> None:
    present = ["mine", "theirs", "old", "old"]
    assert dns01.leftovers(present, {"theirs"}, "mine") == ["old"]
    assert dns01.leftovers(present, {"theirs", "old"}) == ["mine"]  # a withdraw: its own is done
    assert dns01.leftovers(present, set()) == ["mine", "theirs", "old"]
    assert dns01.sharing_names(WILDCARD) == dns01.sharing_names(HOST) == (HOST, WILDCARD)


class Label:
    """Our primary's RRset at one label, applying updates as RFC 2136 §3 says: the
    prerequisites first (nothing changes when one fails), then each RR in turn."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self.updates: list[dns.update.UpdateMessage] = []

    def apply(self, update: dns.update.UpdateMessage) -> bool:
        self.updates.append(update)
        required: list[str] = []
        for rrset in update.prerequisite:
            if rrset.rdclass == dns.rdataclass.NONE:  # RRset does not exist
                if self.values:
                    return False
            else:  # value-dependent: accumulated, then compared as a set
                required += _values(rrset)
        if update.prerequisite and required and set(required) != set(self.values):
            return False
        for kind, _, values in _changes(update):
            if kind == "delete-rrset":
                self.values = []
            elif kind == "delete-rr":
                self.values = [v for v in self.values if v not in values]
            else:
                self.values += [v for v in values if v not in self.values]
        return True


@pytest.fixture
def label(monkeypatch: pytest.MonkeyPatch) -> Label:
    kept = Label()

    async def read(zone: dns01.Dns01Zone, hostname: str) -> list[str]:
        assert dns01.delegation_label(hostname) == OWNER
        return list(kept.values)

    async def send(zone: dns01.Dns01Zone, update: dns.update.UpdateMessage, what: str) -> bool:
        return kept.apply(update)

    monkeypatch.setattr(dns01, "values_at_primary", read)
    monkeypatch.setattr(dns01, "_send", send)
    return kept


def _in_use(open_values: set[str]) -> Callable[[], Awaitable[Collection[str]]]:
    """The rows' open orders, as Postgres answers when asked (the set may change)."""

    async def read() -> Collection[str]:
        return set(open_values)

    return read


async def test_the_name_and_its_wildcard_each_add_and_withdraw_only_their_own(label: Label) -> None:
    """Issue 39's pair: the wildcard's publish leaves the name's value, each one's
    withdraw leaves the other's."""
    open_values = {"name-1", "wild-1"}
    assert await dns01.publish(ZONE, HOST, "name-1", _in_use(open_values)) is False
    assert await dns01.publish(ZONE, WILDCARD, "wild-1", _in_use(open_values)) is True  # shared
    assert label.values == ["name-1", "wild-1"]
    open_values.discard("name-1")  # the name's order is valid: its row cleared it
    assert await dns01.withdraw(ZONE, HOST, _in_use(open_values)) == ["name-1"]
    assert label.values == ["wild-1"]
    open_values.discard("wild-1")
    assert await dns01.withdraw(ZONE, WILDCARD, _in_use(open_values)) == ["wild-1"]
    assert label.values == []
    for update in label.updates:
        _never_an_rrset_delete(update)


async def test_a_leftover_of_a_finished_attempt_goes_at_the_next_publish(label: Label) -> None:
    """A worker that died for good before its withdraw (or a withdraw that failed)
    left ``name-1``: the row's next attempt deletes it in the update that adds its
    new value; the wildcard's value in use stays."""
    label.values = ["name-1", "wild-1"]
    assert await dns01.publish(ZONE, HOST, "name-2", _in_use({"name-2", "wild-1"})) is True
    assert label.values == ["wild-1", "name-2"]
    assert _changes(label.updates[-1]) == [("delete-rr", OWNER, ["name-1"]), ("add", OWNER, ["name-2"])]


async def test_a_withdraw_leaves_the_other_rows_value(label: Label) -> None:
    label.values = ["name-1", "wild-1"]
    assert await dns01.withdraw(ZONE, HOST, _in_use({"wild-1"})) == ["name-1"]
    assert label.values == ["wild-1"]
    assert await dns01.withdraw(ZONE, HOST, _in_use({"wild-1"})) == []  # nothing to do: nothing sent
    assert len(label.updates) == 1


async def test_a_publish_retried_after_a_kill_adds_nothing_twice(label: Label) -> None:
    """SIGKILL between the add and the accept: the retried activity adds the same
    value again, which is one RR (and, alone, not shared)."""
    assert await dns01.publish(ZONE, HOST, "name-1", _in_use({"name-1"})) is False
    assert await dns01.publish(ZONE, HOST, "name-1", _in_use({"name-1"})) is False
    assert label.values == ["name-1"]


async def test_a_value_added_between_the_read_and_the_update_is_seen(label: Label) -> None:
    """The wildcard's update lands between the name's read of the label and its own:
    the name's update fails its prerequisite, changing nothing; read again, the
    label holds the wildcard's value, so the name's answer is shared (the CA may
    have cached the RRset without it), and the wildcard's value stays."""
    raced = False

    async def in_use() -> Collection[str]:
        nonlocal raced
        if not raced:
            raced = True
            label.values.append("wild-1")  # the other workflow, in between
        return {"name-1", "wild-1"}

    assert await dns01.publish(ZONE, HOST, "name-1", in_use) is True
    assert label.values == ["wild-1", "name-1"]
    assert len(label.updates) == 2


async def test_a_label_that_never_settles_gets_our_value_anyway(label: Label) -> None:
    async def in_use() -> Collection[str]:
        label.values.append(f"other-{len(label.values)}")  # changed under every try
        return set(label.values) | {"mine"}

    assert await dns01.publish(ZONE, HOST, "mine", in_use) is True
    assert "mine" in label.values and len(label.updates) == dns01.PUBLISH_TRIES + 1
    assert not label.updates[-1].prerequisite
