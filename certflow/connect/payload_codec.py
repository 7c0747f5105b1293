"""Encrypted Temporal payloads: an AES-256-GCM ``PayloadCodec`` on every client and
worker certflow builds (and in ``certflow codec-server``), so that the Temporal
server — Temporal Cloud, or a cluster run by another team — stores hostnames,
tenants, account URLs and error details only as ciphertext.

A payload it encrypted has the encoding ``binary/encrypted`` and names its key
(``encryption-key-id``); the key id is bound to the ciphertext as associated
data. Payloads without that encoding pass through decoding untouched: histories
written before the codec was turned on keep replaying, and a retired key
(``CERTFLOW_PAYLOAD_KEYS_OLD``) keeps decrypting what it encrypted. Failure
messages and stack traces are moved into an encoded payload too
(``DefaultFailureConverterWithEncodedAttributes``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)

from certflow.errors import CertflowError
from certflow.connect.settings import PayloadSettings

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_NONCE_BYTES = 12


class PayloadKeyError(CertflowError):
    """A payload cannot be decrypted with the keys this process has: the message
    names the payload's key id and the settings that hold keys."""


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM under the current key; decrypts under it or any retired key."""

    def __init__(self, current: tuple[str, bytes] | None, old: Iterable[tuple[str, bytes]] = ()) -> None:
        self._current = None if current is None else (current[0], AESGCM(current[1]))
        self._keys = {key_id: AESGCM(key) for key_id, key in old}
        if current is not None:
            self._keys[current[0]] = AESGCM(current[1])

    @property
    def key_id(self) -> str | None:
        """The id of the key that encrypts; None when payloads are sent as they are."""
        return None if self._current is None else self._current[0]

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if self._current is None:
            return list(payloads)
        key_id, aead = self._current
        encoded = []
        for payload in payloads:
            nonce = os.urandom(_NONCE_BYTES)
            sealed = aead.encrypt(nonce, payload.SerializeToString(), key_id.encode())
            encoded.append(
                Payload(
                    metadata={"encoding": ENCODING, KEY_ID: key_id.encode()},
                    data=nonce + sealed,
                )
            )
        return encoded

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decoded(p) for p in payloads]

    def _decoded(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before the codec, or by a process without it
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        aead = self._keys.get(key_id)
        if aead is None:
            raise PayloadKeyError(
                f"a payload is encrypted with key id {key_id!r}, which is neither"
                " CERTFLOW_PAYLOAD_KEY's nor one of CERTFLOW_PAYLOAD_KEYS_OLD's"
            )
        nonce, sealed = payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:]
        try:
            plain = aead.decrypt(nonce, sealed, key_id.encode())
        except InvalidTag:
            raise PayloadKeyError(
                f"a payload with key id {key_id!r} does not decrypt: the key configured"
                " under that id is not the one that encrypted it"
            ) from None
        return Payload.FromString(plain)


def payload_codec(settings: PayloadSettings) -> EncryptionCodec | None:
    """The codec the settings ask for; None when no key is configured at all."""
    current, old = settings.payload_key_pair, settings.old_payload_key_pairs
    if current is None and not old:
        return None
    return EncryptionCodec(current, old)


def data_converter(settings: PayloadSettings) -> DataConverter:
    """certflow's converter (pydantic payloads), encrypting when a key is set.

    With only retired keys (encryption being turned off) nothing new is
    encrypted and what was still decrypts."""
    codec = payload_codec(settings)
    if codec is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
