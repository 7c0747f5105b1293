"""Every payload a Temporal history holds, read raw (as the server stores it, not
decoded): for the tests that prove the payload codec leaves nothing readable.

Search attributes are skipped: no codec encodes them, by Temporal's design
(docs/operating.md says which ones certflow sets)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload, SearchAttributes
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent


def payloads_in(message: Message) -> Iterator[Payload]:
    """Each Payload anywhere inside ``message`` (failures, inputs, results,
    markers, memos, headers, user metadata), search attributes excepted."""
    if isinstance(message, SearchAttributes):
        return
    if isinstance(message, Payload):
        yield message
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            for entry in value.values():
                if isinstance(entry, Message):
                    yield from payloads_in(entry)
        elif isinstance(value, Message):
            yield from payloads_in(value)
        else:  # a repeated field
            for item in value:
                yield from payloads_in(item)


def readable_payloads(events: Iterable[HistoryEvent], needles: Iterable[str]) -> list[str]:
    """What of ``needles`` shows in any raw payload, as "<event type>: <needle>"."""
    wanted = [n.encode() for n in needles]
    found = []
    for event in events:
        for payload in payloads_in(event):
            raw = payload.SerializeToString()
            kind = EventType.Name(event.event_type)
            found += [f"{kind}: {n.decode()}" for n in wanted if n in raw]
    return found


def encodings(events: Iterable[HistoryEvent]) -> set[bytes]:
    """The ``encoding`` of every raw payload but the SDK's own bookkeeping: a local
    activity's marker keeps its sequence number, type and times in a plain
    ``data`` detail (its result is a payload of its own, encoded)."""
    found = set()
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            details = event.marker_recorded_event_attributes.details
            for name, payloads in details.items():
                if name != "data":
                    found |= {p.metadata.get("encoding", b"") for p in payloads.payloads}
            if event.marker_recorded_event_attributes.HasField("failure"):
                found |= {p.metadata.get("encoding", b"") for p in payloads_in(event.marker_recorded_event_attributes.failure)}
            continue
        found |= {p.metadata.get("encoding", b"") for p in payloads_in(event)}
    return found
