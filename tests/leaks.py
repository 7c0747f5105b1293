"""The one detector of leaked private keys used by every test that promises "no key
material": not in Postgres, not in any Temporal payload or history (decoded), not
in logs (docs/guarantees.md).

Test tooling, not shipped. Three places, one vocabulary:

- :func:`key_needles` turns private keys into the byte strings a leak of them
  would contain (:class:`Needle`, each labelled for findings).
- :func:`workflow_leaks` walks every run of every workflow a visibility query
  lists, plus every run and child linked from their histories, and searches every
  ``Payload`` anywhere in the history, description and visibility record (decoded
  with the client's payload codec) and every string in them.
- :func:`table_leaks` reads every row and column of every user table.
- :func:`log_leaks` reads log files (or texts).
- :func:`all_leaks` combines them.

Each returns :class:`Findings`: a list of human-readable findings (empty when
nothing leaked) that also records what was inspected, so a test can prove the
search was not vacuous (e.g. ``len(findings.runs) >= expected``).

Every searched byte string is also searched in its decoded forms: the strings
of a JSON document and JSON string literals inside any text (escapes undone,
``\u0081`` included), Python ``repr()`` of bytes (``b'0\x81\x87…'``), lists of
byte values (``[48, 129, 135, …]``), URL-encoded runs (``%30%81…``), and in each
of those every long hex or base64/base64url run decoded (bytea rendered as hex,
bytes a serializer wrote as base64, a hex dump in a message).

Two kinds of finding: a *needle* (bytes of a known key: see :func:`key_needles`)
anywhere in any view, and a *structure*: in any view, a DER private key of any
key — PKCS#8 (``PrivateKeyInfo``/``OneAsymmetricKey``), SEC1 (``ECPrivateKey``)
or PKCS#1 (``RSAPrivateKey``) — that parses as one. Structures need no needle:
they find the key of a test that never captured it.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import binascii
import bisect
import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import asyncpg
import temporalio.client
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa, x448, x25519
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload, WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflow.v1 import WorkflowExecutionInfo
from temporalio.service import RPCError, RPCStatusCode

__all__ = [
    "PEM_PRIVATE_KEY",
    "Findings",
    "Needle",
    "all_leaks",
    "key_needles",
    "log_leaks",
    "scan_bytes",
    "table_leaks",
    "workflow_leaks",
]

KeyLike: TypeAlias = PrivateKeyTypes | bytes | str
"""A private key object, or its PEM (or DER) serialization."""

Database: TypeAlias = "asyncpg.Pool | asyncpg.Connection | str"
LogSource: TypeAlias = "str | bytes | os.PathLike[str]"


class Needle(bytes):
    """Bytes whose presence means a leak, with what they are (``label``) for findings."""

    label: str

    def __new__(cls, value: bytes, label: str) -> Needle:
        needle = super().__new__(cls, value)
        needle.label = label
        return needle


PEM_PRIVATE_KEY = Needle(b"PRIVATE KEY-----", "a PEM private key header")
"""Ends every PEM private key header and footer (PKCS#8, EC, RSA, ENCRYPTED, OPENSSH)
and nothing public: ``-----BEGIN CERTIFICATE-----`` does not match."""


def _label(needle: bytes) -> str:
    return needle.label if isinstance(needle, Needle) else f"the bytes {bytes(needle[:12])!r}..."


# ------------------------------------------------------------------------------ needles


def key_needles(*keys: KeyLike) -> list[bytes]:
    """What a leak of these private keys looks like (always includes the PEM header).

    Per key: the PEM body lines (base64, each ≥ 32 characters, of PKCS#8 and of the
    traditional format, except lines that carry only public material, which a
    certificate could contain too); the DER (PKCS#8 and traditional) raw, as hex
    (lower and upper case) and as base64 and base64url; and the private numbers
    (EC scalar, RSA ``d``/``p``/``q``, DSA ``x``, the raw Ed25519/X25519/… key)
    raw, as hex, base64/base64url (what a JWK ``d`` holds) and decimal.

    Base64 needles are cut at each of the three byte alignments, whole groups
    only, so they match the key inside a longer base64 string, padded or not.
    """
    found: dict[bytes, Needle] = {bytes(PEM_PRIVATE_KEY): PEM_PRIVATE_KEY}

    def add(value: bytes, label: str) -> None:
        if value and value not in found:
            found[value] = Needle(value, label)

    for number, key_like in enumerate(keys, 1):
        key = _load_key(key_like)
        name = f"key {number} ({_describe_key(key)})"
        public = _public_blobs(key)
        for fmt_name, fmt in (
            ("PKCS#8", serialization.PrivateFormat.PKCS8),
            ("traditional", serialization.PrivateFormat.TraditionalOpenSSL),
        ):
            try:
                der = key.private_bytes(serialization.Encoding.DER, fmt, serialization.NoEncryption())
                pem = key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
            except ValueError:  # e.g. no traditional format for Ed25519
                continue
            for index, line in enumerate(pem.splitlines()[1:-1], 1):
                if len(line) >= 32 and _carries_secret(line, public):
                    add(line, f"PEM body line {index} of {name} ({fmt_name})")
            _add_encodings(add, der, f"the {fmt_name} DER of {name}")
        for what, value in _private_numbers(key):
            _add_encodings(add, value, f"{what} of {name}")
            if isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, dsa.DSAPrivateKey)):
                add(str(int.from_bytes(value, "big")).encode(), f"{what} of {name} (decimal)")
    return list(found.values())


def _add_encodings(add: Any, value: bytes, label: str) -> None:
    add(value, f"{label} (raw)")
    add(value.hex().encode(), f"{label} (hex)")
    add(value.hex().upper().encode(), f"{label} (HEX)")
    for shift in range(3):
        whole = value[shift:][: (len(value) - shift) // 3 * 3]
        if len(whole) < 12:
            continue
        standard, urlsafe = base64.b64encode(whole), base64.urlsafe_b64encode(whole)
        if standard == urlsafe:
            add(standard, f"{label} (base64 or base64url)")
        else:
            add(standard, f"{label} (base64)")
            add(urlsafe, f"{label} (base64url)")


def _load_key(key: KeyLike) -> PrivateKeyTypes:
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, bytes):
        if b"-----BEGIN" in key:
            return serialization.load_pem_private_key(key, password=None)
        return serialization.load_der_private_key(key, password=None)
    return key


def _describe_key(key: PrivateKeyTypes) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return f"EC {key.curve.name}"
    if isinstance(key, rsa.RSAPrivateKey):
        return f"RSA {key.key_size}"
    if isinstance(key, dsa.DSAPrivateKey):
        return f"DSA {key.key_size}"
    return type(key).__name__.removeprefix("_").removesuffix("PrivateKey") or "key"


def _int_bytes(value: int, length: int | None = None) -> bytes:
    return value.to_bytes(length or max(1, (value.bit_length() + 7) // 8), "big")


def _private_numbers(key: PrivateKeyTypes) -> list[tuple[str, bytes]]:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        size = (key.curve.key_size + 7) // 8
        return [("the private scalar", _int_bytes(key.private_numbers().private_value, size))]
    if isinstance(key, rsa.RSAPrivateKey):
        numbers = key.private_numbers()
        return [
            ("the private exponent d", _int_bytes(numbers.d)),
            ("the prime p", _int_bytes(numbers.p)),
            ("the prime q", _int_bytes(numbers.q)),
        ]
    if isinstance(key, dsa.DSAPrivateKey):
        return [("the private value x", _int_bytes(key.private_numbers().x))]
    if isinstance(
        key,
        (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey, x25519.X25519PrivateKey, x448.X448PrivateKey),
    ):
        return [("the raw private key", key.private_bytes_raw())]
    return []


def _public_blobs(key: PrivateKeyTypes) -> list[bytes]:
    """Encodings of the public half (found in certificates, CSRs, JWS headers)."""
    public = key.public_key()
    blobs = [public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)]
    if isinstance(key, rsa.RSAPrivateKey):
        blobs.append(key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1))
    if isinstance(key, ec.EllipticCurvePrivateKey):
        for fmt in (serialization.PublicFormat.UncompressedPoint, serialization.PublicFormat.CompressedPoint):
            blobs.append(key.public_key().public_bytes(serialization.Encoding.X962, fmt))
    return blobs


def _carries_secret(pem_line: bytes, public: list[bytes]) -> bool:
    """Whether this PEM body line encodes bytes that are not all public material."""
    chunk = base64.b64decode(pem_line)
    return not any(chunk in blob for blob in public)


# ------------------------------------------------------------------------------ search

_WINDOW = 8
_HEX_RUN = re.compile(rb"[0-9a-fA-F]{64,}")
_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{40,}={0,2}")
_JOIN = b"\x00\x1e\x00"


class _Matcher:
    """Finds many needles in one pass: every needle of length ≥ 2·W-1 covers a W-byte
    window starting at a multiple of W at one of its first W offsets, so only those
    windows are looked up (W = 8); shorter needles are searched one by one."""

    def __init__(self, needles: Iterable[bytes]) -> None:
        self.needles = list(dict.fromkeys(needles))
        self.short = [n for n in self.needles if 0 < len(n) < 2 * _WINDOW - 1]
        self.index: dict[bytes, list[tuple[bytes, int]]] = {}
        for needle in self.needles:
            if len(needle) >= 2 * _WINDOW - 1:
                for offset in range(_WINDOW):
                    self.index.setdefault(bytes(needle[offset : offset + _WINDOW]), []).append((needle, offset))

    def find(self, data: bytes) -> dict[bytes, int]:
        """Each needle found in data, with its first position."""
        hits: dict[bytes, int] = {}
        for needle in self.short:
            position = data.find(needle)
            if position >= 0:
                hits[needle] = position
        index = self.index
        for i in range(0, len(data) - _WINDOW + 1, _WINDOW):
            candidates = index.get(data[i : i + _WINDOW])
            if candidates:
                for needle, offset in candidates:
                    start = i - offset
                    if start >= 0 and needle not in hits and data.startswith(needle, start):
                        hits[needle] = start
        return hits


def _json_strings(data: bytes) -> bytes | None:
    """Every string (keys too) of a JSON document, escapes undone, or None."""
    stripped = data.lstrip()
    if b"\\" not in data or not stripped[:1] in (b"{", b"[", b'"'):
        return None
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    strings: list[str] = []

    def collect(value: Any) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                strings.append(str(key))
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    collect(document)
    return _JOIN.join(s.encode("utf-8", "surrogatepass") for s in strings) if strings else None


def _decoded_runs(data: bytes) -> Iterator[tuple[str, int, bytes]]:
    for match in _HEX_RUN.finditer(data):
        run = match.group()
        yield "hex-decoded", match.start(), bytes.fromhex(run[: len(run) // 2 * 2].decode())
    for match in _BASE64_RUN.finditer(data):
        run = match.group().rstrip(b"=")
        standard, urlsafe = bool(re.search(rb"[+/]", run)), bool(re.search(rb"[-_]", run))
        if standard and urlsafe:
            continue
        if len(run) % 4 == 1:  # not base64 there: one character too many
            run = run[:-1]
        run += b"=" * (-len(run) % 4)
        try:
            yield "base64-decoded", match.start(), base64.b64decode(run, altchars=b"-_" if urlsafe else None)
        except (binascii.Error, ValueError):
            continue


_BYTES_REPR = re.compile(rb"b'(?:[^'\\\n]|\\.){16,}'" + rb'|b"(?:[^"\\\n]|\\.){16,}"')
_INT_LIST = re.compile(rb"\[\s*\d{1,3}(?:\s*,\s*\d{1,3}){15,}\s*\]")
_PERCENT_RUN = re.compile(
    rb"(?:%[0-9A-Fa-f]{2}|[A-Za-z0-9._~+/=-])*%[0-9A-Fa-f]{2}(?:%[0-9A-Fa-f]{2}|[A-Za-z0-9._~+/=-]){14,}"
)
_JSON_LITERAL = re.compile(rb'"(?:[^"\\\n]|\\.){16,}"')


def _literal_views(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Byte strings written the ways code writes them into text: ``repr()`` of
    bytes, a list of byte values, URL-encoding, a JSON string literal."""
    for match in _BYTES_REPR.finditer(data):
        try:
            value = ast.literal_eval(match.group().decode("ascii"))
        except (ValueError, SyntaxError, UnicodeDecodeError):
            continue
        if isinstance(value, bytes):
            yield "repr-decoded", value
    for match in _INT_LIST.finditer(data):
        numbers = [int(n) for n in re.findall(rb"\d+", match.group())]
        if all(n < 256 for n in numbers):
            yield "list-decoded", bytes(numbers)
    for match in _PERCENT_RUN.finditer(data):
        yield "URL-decoded", urllib.parse.unquote_to_bytes(match.group())
    if b"\\" in data:
        for match in _JSON_LITERAL.finditer(data):
            if b"\\" not in match.group():
                continue
            try:
                text = json.loads(match.group())
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(text, str):
                if all(ord(c) < 256 for c in text):
                    yield "JSON-unescaped", text.encode("latin-1")
                else:
                    yield "JSON-unescaped", text.encode("utf-8", "surrogatepass")


def _views(data: bytes) -> Iterator[tuple[str, int | None, bytes]]:
    """(how it was decoded, its position in data when known, bytes): data itself, its
    JSON strings, the byte strings written into it as literals, and the hex and
    base64 runs of each, decoded."""
    yield "", 0, data
    texts: list[tuple[str, int | None, bytes]] = [("", 0, data)]
    strings = _json_strings(data)
    if strings is not None:
        yield "JSON-decoded", None, strings
        texts.append(("JSON-decoded", None, strings))
    for how, base, text in list(texts):
        for literal_how, decoded in _literal_views(text):
            label = f"{how}, {literal_how}" if how else literal_how
            yield label, None, decoded
            texts.append((label, None, decoded))
    for how, base, text in list(texts):
        for body in _PEM_BLOCK.finditer(text):
            label = f"{how}, PEM-decoded" if how else "PEM-decoded"
            try:
                yield label, None, base64.b64decode(re.sub(rb"[^A-Za-z0-9+/=]", b"", body.group(1)))
            except (binascii.Error, ValueError):
                continue
    for how, base, text in texts:
        for run_how, start, decoded in _decoded_runs(text):
            yield (f"{how}, {run_how}" if how else run_how), (start if base is not None else None), decoded


# A DER SEQUENCE header, then how each private key structure begins: PKCS#8
# (version 0 or 1, an AlgorithmIdentifier), SEC1 (version 1, the private key
# octets of P-256/P-384/P-521), PKCS#1 (version 0, the modulus).
_DER_KEY = re.compile(
    rb"\x30(?:[\x01-\x7f]|\x81[\x80-\xff]|\x82[\x01-\xff][\x00-\xff])"
    rb"(?=\x02\x01[\x00\x01]\x30|\x02\x01\x01\x04[\x20\x30\x42]|\x02\x01\x00\x02[\x81\x82])",
    re.DOTALL,
)
_STRUCTURE = "a DER private key"
_PEM_BLOCK = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(.*?)-----END", re.DOTALL)


def _der_keys(data: bytes) -> Iterator[tuple[int, str]]:
    """(position, what) of every DER private key structure in data that parses."""
    for match in _DER_KEY.finditer(data):
        start, header = match.start(), match.group()
        if len(header) == 2:
            length = header[1]
        else:
            length = int.from_bytes(header[2:], "big")
        candidate = data[start : start + len(header) + length]
        if len(candidate) < len(header) + length:
            continue
        try:
            key = serialization.load_der_private_key(candidate, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
        kind = "SEC1" if candidate[len(header) : len(header) + 3] == b"\x02\x01\x01" and (
            candidate[len(header) + 3 : len(header) + 4] == b"\x04"
        ) else ("PKCS#1" if candidate[len(header) + 3 : len(header) + 4] == b"\x02" else "PKCS#8")
        yield start, f"{_STRUCTURE} ({kind}, {_describe_key(key)})"


def _search(matcher: _Matcher, data: bytes) -> list[tuple[bytes, str, int | None]]:
    """(needle, label, position in data when known) of each needle found in any view
    of data (the first view that shows it), and of each private key structure (its
    "needle" is its bytes)."""
    found: dict[bytes, tuple[bytes, str, int | None]] = {}
    for how, base, view in _views(data):
        for needle, position in matcher.find(view).items():
            if needle not in found:
                label = _label(needle) + (f" ({how})" if how else "")
                at = (base + position) if base is not None and how == "" else base
                found[needle] = (needle, label, at)
        header = view.find(PEM_PRIVATE_KEY)
        if header >= 0 and bytes(PEM_PRIVATE_KEY) not in found:
            label = PEM_PRIVATE_KEY.label + (f" ({how})" if how else "")
            at = (base + header) if base is not None and how == "" else base
            found[bytes(PEM_PRIVATE_KEY)] = (PEM_PRIVATE_KEY, label, at)
        for position, what in _der_keys(view):
            marker = b"structure:" + view[position : position + 16]
            if marker not in found:
                label = what + (f" ({how})" if how else "")
                at = (base + position) if base is not None and how == "" else base
                found[marker] = (marker, label, at)
    return list(found.values())


def _contains(labels: Sequence[str]) -> str:
    shown = ", ".join(labels[:4])
    return f"contains {shown}" + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")


def scan_bytes(data: bytes | str, needles: Iterable[bytes]) -> list[str]:
    """The labels of the needles found in data (in any decoded view of it)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    return [label for _, label, _ in _search(_Matcher(needles), raw)]


class Findings(list[str]):
    """Human-readable findings, one per place that holds key material (empty: none),
    and what the search inspected (so a test can prove it was not vacuous)."""

    def __init__(self, findings: Iterable[str] = ()) -> None:
        super().__init__(findings)
        self.runs: set[tuple[str, str]] = set()
        """(workflow id, run id) of every run whose history was searched."""
        self.payloads = 0
        self.unreachable: list[str] = []
        """Workflows or schedules linked or named but not found (not leaks)."""
        self.tables: set[str] = set()
        self.rows = 0
        self.cells = 0
        self.logs = 0
        self.lines = 0

    def merge(self, other: Findings) -> Findings:
        self.extend(other)
        self.runs |= other.runs
        self.payloads += other.payloads
        self.unreachable += other.unreachable
        self.tables |= other.tables
        self.rows += other.rows
        self.cells += other.cells
        self.logs += other.logs
        self.lines += other.lines
        return self

    def summary(self) -> str:
        return (
            f"{len(self)} findings; inspected {len(self.runs)} workflow runs ({self.payloads}"
            f" payloads), {len(self.tables)} tables ({self.rows} rows, {self.cells} cells),"
            f" {self.logs} logs ({self.lines} lines)"
        )


# ------------------------------------------------------------------------------ temporal

_RUN_LINKS = ("continued_execution_run_id", "first_execution_run_id", "original_execution_run_id",
              "new_execution_run_id")
_ANY = "google.protobuf.Any"
_Item: TypeAlias = "tuple[str, Payload | WorkflowExecution | str | bytes]"


def _is_repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(getattr(field, "label", None) == 3)  # protobuf < 6: LABEL_REPEATED


def _walk(message: Message, path: str) -> Iterator[_Item]:
    """Every Payload, WorkflowExecution, string and bytes value anywhere in message
    (fields, repeated fields, map keys and values, packed ``Any``), with its path."""
    name = message.DESCRIPTOR.full_name
    if isinstance(message, Payload):
        yield path, message
        return
    if isinstance(message, WorkflowExecution):
        yield path, message
    if name == _ANY:
        inner = _unpack_any(message)
        if inner is not None:
            yield from _walk(inner, path)
            return
    for field, value in message.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        entry_type = field.message_type
        if entry_type is not None:
            if entry_type.GetOptions().map_entry:
                value_field = entry_type.fields_by_name["value"]
                for key, item in value.items():
                    entry = f"{where}[{key!r}]"
                    if isinstance(key, (str, bytes)):
                        yield f"{entry} (key)", key
                    if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                        yield from _walk(item, entry)
                    elif isinstance(item, (str, bytes)):
                        yield entry, item
            elif _is_repeated(field):
                for index, item in enumerate(value):
                    yield from _walk(item, f"{where}[{index}]")
            else:
                yield from _walk(value, where)
        elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            if _is_repeated(field):
                for index, item in enumerate(value):
                    yield f"{where}[{index}]", item
            else:
                yield where, value


def _unpack_any(packed: Message) -> Message | None:
    type_url: str = getattr(packed, "type_url", "")
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(type_url.rsplit("/", 1)[-1])
        inner = message_factory.GetMessageClass(descriptor)()
        inner.ParseFromString(getattr(packed, "value", b""))
    except Exception:  # unknown type: its bytes are searched raw instead
        return None
    return inner


def _event_type(event: Message) -> str:
    raw = EventType.Name(getattr(event, "event_type")).removeprefix("EVENT_TYPE_")
    return "".join(part.capitalize() for part in raw.split("_"))


@dataclass
class _Scanner:
    """Searches the protos of one client's namespace, payloads decoded by its converter."""

    client: temporalio.client.Client
    matcher: _Matcher

    async def scan(self, where: str, messages: Sequence[tuple[str, Message]], findings: Findings) -> list[WorkflowExecution]:
        """Search messages [(location, proto)]; return the workflow executions they name."""
        payloads: list[tuple[str, str, Payload]] = []
        executions: list[WorkflowExecution] = []
        for location, message in messages:
            for path, value in _walk(message, ""):
                if isinstance(value, Payload):
                    payloads.append((location, path, value))
                elif isinstance(value, WorkflowExecution):
                    executions.append(value)
                else:
                    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
                    hits = _search(self.matcher, raw)
                    if hits:
                        findings.append(f"{where} {location}: {path} {_contains([h[1] for h in hits])}")
        decoded = await self._decode([p for _, _, p in payloads], findings, where)
        for (location, path, payload), plain in zip(payloads, decoded):
            findings.payloads += 1
            labels: dict[bytes, str] = {}
            blobs = [plain.data, *plain.metadata.values(), *(k.encode() for k in plain.metadata)]
            if plain is not payload:
                blobs += [payload.data, *payload.metadata.values()]
            for blob in blobs:
                for needle, label, _ in _search(self.matcher, blob):
                    labels.setdefault(needle, label)
            if labels:
                findings.append(f"{where} {location}: payload {path} {_contains(list(labels.values()))}")
        return executions

    async def _decode(self, payloads: list[Payload], findings: Findings, where: str) -> list[Payload]:
        """Each payload as the application sees it (external storage, codec), or the
        payload itself when there is nothing to undo or undoing fails."""
        if not payloads:
            return []
        converter = self.client.data_converter
        storage = getattr(converter, "external_storage", None)
        transform = getattr(converter, "_transform_inbound_payload", None)
        if storage is not None and transform is not None:  # also runs the codec
            out = []
            for payload in payloads:
                try:
                    out.append(await transform(payload))
                except Exception as err:
                    findings.append(f"{where}: a payload could not be retrieved/decoded ({err!r})")
                    out.append(payload)
            return out
        codec = converter.payload_codec
        if codec is None:
            return payloads
        try:
            return list(await codec.decode(payloads))
        except Exception:
            out = []
            for payload in payloads:  # one by one: e.g. search attributes are never encoded
                try:
                    out.append((await codec.decode([payload]))[0])
                except Exception:
                    out.append(payload)
            return out


def _run_links(workflow_id: str, event: Message) -> Iterator[tuple[str, str]]:
    """Runs an event names: the previous/next/first run of this workflow, and the
    workflow ids of children it starts (their runs are resolved later)."""
    kind = event.WhichOneof("attributes")
    if kind is None:
        return
    attributes = getattr(event, kind)
    fields = attributes.DESCRIPTOR.fields_by_name
    for name in _RUN_LINKS:
        if name in fields and getattr(attributes, name):
            yield workflow_id, getattr(attributes, name)
    if "workflow_id" in fields and getattr(attributes, "workflow_id"):
        yield getattr(attributes, "workflow_id"), ""


def _quoted(value: str) -> str | None:
    return None if any(c in value for c in "\"'\\") else f'"{value}"'


async def workflow_leaks(
    client: temporalio.client.Client,
    needles: Iterable[bytes],
    *,
    query: str | None = None,
    schedule_ids: Iterable[str] = (),
    concurrency: int = 8,
) -> Findings:
    """Search every run of every workflow the visibility ``query`` lists (None: the
    whole namespace) for the needles, following the runs and children their
    histories link to (continue-as-new, first run, ``StartChildWorkflowExecution``,
    ``ChildWorkflowExecutionStarted``, any ``WorkflowExecution``), whether listed or not.

    Per run it searches the full history, the description (pending activities'
    heartbeat details and last failures, memo, search attributes, …) and the
    visibility record: every ``Payload`` anywhere in those protos (decoded through
    the client's data converter: its payload codec and external storage), its data
    and metadata, and every other string and bytes field (failure messages and
    stack traces, identities, …). Schedules named in ``schedule_ids`` are searched
    too. At most ``concurrency`` runs are fetched at a time.

    A finding reads ``workflow <id> run <run id> event 12 ActivityTaskCompleted:
    payload activity_task_completed_event_attributes.result.payloads[0] contains a
    PEM private key header, …``; a run that could not be read is a finding too.
    """
    scanner = _Scanner(client, _Matcher(needles))
    findings = Findings()
    limit = asyncio.Semaphore(concurrency)
    records: dict[tuple[str, str], WorkflowExecutionInfo] = {}
    known_ids: set[str] = set()
    async for execution in client.list_workflows(query):
        records[(execution.id, execution.run_id)] = execution.raw_info
        known_ids.add(execution.id)

    async def inspect(workflow_id: str, run_id: str) -> list[tuple[str, str]]:
        where = f"workflow {workflow_id} run {run_id}"
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        async with limit:
            try:
                history = await handle.fetch_history()
                description = await handle.describe()
            except RPCError as err:
                findings.append(f"{where}: could not be inspected ({err.status.name}: {err.message})")
                return []
        findings.runs.add((workflow_id, run_id))
        links: list[tuple[str, str]] = []
        messages: list[tuple[str, Message]] = []
        for event in history.events:
            messages.append((f"event {event.event_id} {_event_type(event)}", event))
            links += _run_links(workflow_id, event)
        messages.append(("description", description.raw_description))
        if (workflow_id, run_id) in records:
            messages.append(("visibility record", records[(workflow_id, run_id)]))
        executions = await scanner.scan(where, messages, findings)
        links += [(e.workflow_id, e.run_id) for e in executions if e.workflow_id]
        return links

    async def runs_of(workflow_id: str) -> list[tuple[str, str]]:
        """Every run of a workflow found by id only: the latest, and all visibility lists."""
        runs: list[tuple[str, str]] = []
        async with limit:
            try:
                latest = await client.get_workflow_handle(workflow_id).describe()
                runs.append((workflow_id, latest.run_id or ""))
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    findings.append(f"workflow {workflow_id}: could not be described ({err.status.name}: {err.message})")
                else:
                    findings.unreachable.append(f"workflow {workflow_id}: not found")
            quoted = _quoted(workflow_id)
            if quoted is not None:
                async for execution in client.list_workflows(f"WorkflowId = {quoted}"):
                    records.setdefault((execution.id, execution.run_id), execution.raw_info)
                    runs.append((execution.id, execution.run_id))
        return [r for r in runs if r[1]]

    pending = list(records)
    visited: set[tuple[str, str]] = set()
    while pending:
        batch = [run for run in dict.fromkeys(pending) if run not in visited]
        visited.update(batch)
        pending = []
        linked = [link for links in await asyncio.gather(*(inspect(w, r) for w, r in batch)) for link in links]
        new_ids = sorted({w for w, _ in linked if w not in known_ids})
        known_ids.update(new_ids)
        pending += [run for run in linked if run[1] and run not in visited]
        for runs in await asyncio.gather(*(runs_of(w) for w in new_ids)):
            pending += [run for run in runs if run not in visited]

    for schedule_id in schedule_ids:
        try:
            schedule = await client.get_schedule_handle(schedule_id).describe()
        except RPCError as err:
            findings.unreachable.append(f"schedule {schedule_id}: {err.status.name}")
            continue
        await scanner.scan(f"schedule {schedule_id}", [("description", schedule.raw_description)], findings)
    return findings


# ------------------------------------------------------------------------------ postgres

_BYTEA = 17


async def table_leaks(database: Database, needles: Iterable[bytes], *, page: int = 500) -> Findings:
    """Search every row and column of every table (and materialized view) in every
    user schema of the database (a pool, a connection or a DSN) for the needles.

    ``bytea`` values (and domains and arrays of it) are searched as raw bytes,
    everything else in its text form (UTF-8), each also decoded (JSON strings,
    hex and base64 runs: a bytea inside a composite or JSON renders as hex). One
    repeatable-read snapshot, read through cursors ``page`` rows at a time. A
    finding names the table, the column and the row's primary key (or ctid).
    """
    if isinstance(database, str):
        connection = await asyncpg.connect(database)
        try:
            return await _table_leaks(connection, _Matcher(needles), page)
        finally:
            await connection.close()
    if isinstance(database, asyncpg.Pool):
        async with database.acquire() as connection:
            return await _table_leaks(connection, _Matcher(needles), page)
    return await _table_leaks(database, _Matcher(needles), page)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _table_leaks(connection: Any, matcher: _Matcher, page: int) -> Findings:
    findings = Findings()
    async with connection.transaction(isolation="repeatable_read", readonly=True):
        types = {
            r["oid"]: (r["typtype"], r["typbasetype"], r["typelem"], r["typcategory"])
            for r in await connection.fetch(
                "SELECT oid, typtype, typbasetype, typelem, typcategory FROM pg_type"
            )
        }

        def base(oid: int) -> int:
            while oid in types and types[oid][0] == "d":
                oid = types[oid][1]
            return oid

        tables = await connection.fetch(
            """
            SELECT c.oid, n.nspname, c.relname
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relkind IN ('r', 'm') AND c.relispopulated
              AND n.nspname NOT IN ('pg_catalog', 'information_schema')
              AND n.nspname !~ '^pg_(toast|temp_)'
            ORDER BY n.nspname, c.relname
            """
        )
        for table in tables:
            name = f"{table['nspname']}.{table['relname']}"
            columns = await connection.fetch(
                "SELECT attname, atttypid FROM pg_attribute"
                " WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                table["oid"],
            )
            keys = [
                r["attname"]
                for r in await connection.fetch(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
                    " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
                    " WHERE i.indrelid = $1 AND i.indisprimary"
                    " ORDER BY array_position(i.indkey::int2[], a.attnum)",
                    table["oid"],
                )
            ]
            selected = ["ctid::text"]
            selected += [f"{_ident(k)}::text" for k in keys]
            for column in columns:
                oid = base(column["atttypid"])
                kind = types.get(oid, ("b", 0, 0, ""))
                if oid == _BYTEA:
                    selected.append(f"{_ident(column['attname'])}::bytea")
                elif kind[3] == "A" and base(kind[2]) == _BYTEA:
                    selected.append(f"{_ident(column['attname'])}::bytea[]")
                else:
                    selected.append(f"{_ident(column['attname'])}::text")
            sql = f"SELECT {', '.join(selected)} FROM {_ident(table['nspname'])}.{_ident(table['relname'])}"
            findings.tables.add(name)
            async for record in connection.cursor(sql, prefetch=page):
                findings.rows += 1
                values = list(record.values())
                ctid, key_values, cells = values[0], values[1 : 1 + len(keys)], values[1 + len(keys) :]
                row = (
                    ", ".join(f"{k}={v}" for k, v in zip(keys, key_values)) if keys else f"ctid={ctid}"
                )
                for column, value in zip(columns, cells):
                    if value is None:
                        continue
                    findings.cells += 1
                    parts = value if isinstance(value, list) else [value]
                    labels: dict[bytes, str] = {}
                    for part in parts:
                        if part is None:
                            continue
                        raw = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else bytes(part)
                        for needle, label, _ in _search(matcher, raw):
                            labels.setdefault(needle, label)
                    if labels:
                        findings.append(
                            f"table {name} column {column['attname']} row {row}:"
                            f" {_contains(list(labels.values()))}"
                        )
    return findings


# ------------------------------------------------------------------------------ logs


def log_leaks(sources: LogSource | Iterable[LogSource], needles: Iterable[bytes]) -> Findings:
    """Search logs for the needles: each source is a path (``os.PathLike``: the file is
    read) or the text itself (``str``/``bytes``). Every line is searched (a JSON line
    also with its strings decoded), then the whole text for what spans lines; a
    finding names the log and the line number."""
    matcher = _Matcher(needles)
    findings = Findings()
    if isinstance(sources, (str, bytes, os.PathLike)):
        sources = [sources]
    for number, source in enumerate(sources, 1):
        if isinstance(source, os.PathLike):
            name, data = f"log {os.fspath(source)}", Path(source).read_bytes()
        else:
            name = f"log text {number}"
            data = source.encode("utf-8", "surrogatepass") if isinstance(source, str) else bytes(source)
        findings.logs += 1
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        findings.lines += len(lines)
        by_line: dict[int, dict[bytes, str]] = {}
        for index, line in enumerate(lines, 1):
            for needle, label, _ in _search(matcher, line):
                by_line.setdefault(index, {})[needle] = label
        seen = {needle for labels in by_line.values() for needle in labels}
        starts = [0] + [m.end() for m in re.finditer(rb"\n", data)]
        for needle, label, position in _search(matcher, data):
            if needle not in seen:  # only visible across lines (or in a decoded run)
                line_number = 0 if position is None else bisect.bisect_right(starts, position)
                by_line.setdefault(line_number, {})[needle] = label
        for line_number, labels in sorted(by_line.items()):
            at = f"line {line_number}" if line_number else "a decoded part"
            findings.append(f"{name} {at}: {_contains(list(labels.values()))}")
    return findings


# ------------------------------------------------------------------------------ all


async def all_leaks(
    needles: Iterable[bytes],
    *,
    client: temporalio.client.Client | None = None,
    query: str | None = None,
    schedule_ids: Iterable[str] = (),
    database: Database | None = None,
    logs: Iterable[LogSource] = (),
) -> Findings:
    """:func:`workflow_leaks` (when a client is given), :func:`table_leaks` (when a
    database is given) and :func:`log_leaks`, merged."""
    needles = list(needles)
    findings = Findings()
    if client is not None:
        findings.merge(await workflow_leaks(client, needles, query=query, schedule_ids=schedule_ids))
    if database is not None:
        findings.merge(await table_leaks(database, needles))
    findings.merge(log_leaks(list(logs), needles))
    return findings
