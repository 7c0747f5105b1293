"""The payload codec (AES-256-GCM, key ids, retired keys) and the codec server's
protocol, CORS and authorization.

How these go red: make ``EncryptionCodec.encode`` return its input and the
plaintext test fails; drop the ``_authorized`` check and the 401 tests fail;
drop the key id from the associated data and the relabelled-payload test
fails (each checked once)."""

from __future__ import annotations

import base64
import json
import os

import httpx
import pytest
from temporalio.api.common.v1 import Payload

from certflow.product.codec_server import CodecServer
from certflow.errors import ConfigError
from certflow.hostnames import as_hostname
from certflow.connect.payload_codec import ENCODING, KEY_ID, EncryptionCodec, PayloadKeyError, data_converter
from certflow.connect.settings import ClientSettings, CodecServerSettings, load_settings, parse_payload_key
from certflow.workflow_payloads import CertificateInput

KEY = bytes(range(32))
OLD = bytes(range(1, 33))
HOSTNAME = "shop.customer-secret.test"
SECRET = "operators-only-secret"
UI = "https://ui.example.test"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _plain(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(text).encode())


async def test_encrypted_payloads_hold_no_plaintext_and_decode_back() -> None:
    codec = EncryptionCodec(("k2", KEY))
    original = [_plain(HOSTNAME), _plain("tenant-42")]
    sealed = await codec.encode(original)
    for payload in sealed:
        assert payload.metadata["encoding"] == ENCODING
        assert payload.metadata[KEY_ID] == b"k2"
        assert HOSTNAME.encode() not in payload.SerializeToString()
        assert b"tenant-42" not in payload.SerializeToString()
    assert await codec.decode(sealed) == original
    assert sealed[0].data != (await codec.encode(original[:1]))[0].data  # a fresh nonce each time


async def test_payloads_from_before_the_codec_pass_through() -> None:
    codec = EncryptionCodec(("k2", KEY))
    assert await codec.decode([_plain(HOSTNAME)]) == [_plain(HOSTNAME)]


async def test_a_retired_key_still_decrypts_and_only_the_current_one_encrypts() -> None:
    before = await EncryptionCodec(("k1", OLD)).encode([_plain(HOSTNAME)])
    rotated = EncryptionCodec(("k2", KEY), [("k1", OLD)])
    assert await rotated.decode(before) == [_plain(HOSTNAME)]
    assert (await rotated.encode([_plain(HOSTNAME)]))[0].metadata[KEY_ID] == b"k2"
    turned_off = EncryptionCodec(None, [("k1", OLD)])
    assert await turned_off.encode([_plain(HOSTNAME)]) == [_plain(HOSTNAME)]
    assert await turned_off.decode(before) == [_plain(HOSTNAME)]


async def test_an_unknown_key_id_or_a_wrong_key_is_a_clear_error() -> None:
    sealed = await EncryptionCodec(("k1", OLD)).encode([_plain(HOSTNAME)])
    with pytest.raises(PayloadKeyError, match="key id 'k1', which is neither CERTFLOW_PAYLOAD_KEY"):
        await EncryptionCodec(("k2", KEY)).decode(sealed)
    with pytest.raises(PayloadKeyError, match="key id 'k1' does not decrypt"):
        await EncryptionCodec(("k1", KEY)).decode(sealed)


async def test_a_relabelled_payload_does_not_decrypt() -> None:
    """The key id is bound to the ciphertext: moving a payload under another id
    (both keys the same bytes) is refused."""
    sealed = (await EncryptionCodec(("k1", KEY)).encode([_plain(HOSTNAME)]))[0]
    sealed.metadata[KEY_ID] = b"k2"
    with pytest.raises(PayloadKeyError):
        await EncryptionCodec(("k2", KEY)).decode([sealed])


async def test_the_data_converter_encrypts_certflows_payloads(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    clean_environment.setenv("CERTFLOW_DATABASE_URL", "postgresql://postgres@127.0.0.1/certflow")
    clean_environment.setenv("CERTFLOW_PAYLOAD_KEY", f"prod-1:{_b64(KEY)}")
    converter = data_converter(load_settings(ClientSettings))
    value = CertificateInput(hostname=as_hostname(HOSTNAME), tenant_id="tenant-42")
    payloads = await converter.encode([value])
    assert HOSTNAME.encode() not in payloads[0].SerializeToString()
    assert await converter.decode(payloads, [CertificateInput]) == [value]
    clean_environment.delenv("CERTFLOW_PAYLOAD_KEY")
    plain = await data_converter(load_settings(ClientSettings)).encode([value])
    assert HOSTNAME.encode() in plain[0].SerializeToString()


def test_payload_key_forms() -> None:
    assert parse_payload_key(f"prod-1:{_b64(KEY)}") == ("prod-1", KEY)
    derived, key = parse_payload_key(_b64(KEY))
    assert key == KEY and derived.startswith("k") and derived != parse_payload_key(_b64(OLD))[0]
    for bad, message in (
        (_b64(KEY[:16]), "32 bytes"),
        ("not base64!", "base64"),
        (f"bad id:{_b64(KEY)}", "key id"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_payload_key(bad)


def test_a_bad_payload_key_setting_names_its_variable(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("CERTFLOW_DATABASE_URL", "postgresql://postgres@127.0.0.1/certflow")
    clean_environment.setenv("CERTFLOW_PAYLOAD_KEYS_OLD", f"{_b64(KEY)},{_b64(KEY[:8])}")
    with pytest.raises(ConfigError, match="^CERTFLOW_PAYLOAD_KEYS_OLD: key 2: must decode to 32 bytes"):
        load_settings(ClientSettings)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"CERTFLOW_CODEC_SECRET": SECRET}, "^CERTFLOW_PAYLOAD_KEY is not set"),
        ({"CERTFLOW_PAYLOAD_KEY": _b64(KEY)}, "^CERTFLOW_CODEC_SECRET is not set, nor CERTFLOW_CODEC_TLS_CLIENT_CA"),
        ({"CERTFLOW_PAYLOAD_KEY": _b64(KEY), "CERTFLOW_CODEC_SECRET": "short"}, "at least 16"),
    ],
)
def test_the_codec_server_refuses_to_start_open(
    clean_environment: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    for name, value in variables.items():
        clean_environment.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        load_settings(CodecServerSettings)


async def _server_and_sealed() -> tuple[httpx.AsyncClient, list[Payload]]:
    codec = EncryptionCodec(("k2", KEY))
    app = CodecServer(codec, secret=SECRET, cors_origins=frozenset({UI}))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://codec")
    return client, await codec.encode([_plain(HOSTNAME)])


def _document(payloads: list[Payload]) -> dict[str, object]:
    return {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in p.metadata.items()},
                "data": base64.b64encode(p.data).decode(),
            }
            for p in payloads
        ]
    }


async def test_the_codec_server_decodes_for_the_secret_holder_only() -> None:
    client, sealed = await _server_and_sealed()
    async with client:
        for headers in ({}, {"Authorization": "Bearer wrong-secret-of-length"}, {"Authorization": SECRET}):
            refused = await client.post("/decode", json=_document(sealed), headers=headers)
            assert refused.status_code == 401
            assert HOSTNAME not in refused.text
        answer = await client.post(
            "/decode", json=_document(sealed), headers={"Authorization": f"Bearer {SECRET}", "X-Namespace": "default"}
        )
        assert answer.status_code == 200
        decoded = answer.json()["payloads"][0]
        assert json.loads(base64.b64decode(decoded["data"])) == HOSTNAME
        assert base64.b64decode(decoded["metadata"]["encoding"]) == b"json/plain"
        encoded = await client.post(
            "/encode", json=answer.json(), headers={"Authorization": f"Bearer {SECRET}"}
        )
        assert encoded.status_code == 200 and HOSTNAME not in encoded.text
        again = await client.post("/decode", json=encoded.json(), headers={"Authorization": f"Bearer {SECRET}"})
        assert again.json() == answer.json()


async def test_the_codec_server_answers_the_web_uis_cors_preflight() -> None:
    client, _ = await _server_and_sealed()
    async with client:
        preflight = await client.options(
            "/decode",
            headers={"Origin": UI, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization,content-type,x-namespace"},
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == UI
        assert preflight.headers["access-control-allow-credentials"] == "true"
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert {"authorization", "content-type", "x-namespace"} <= {h.strip() for h in allowed.split(",")}
        stranger = await client.options("/decode", headers={"Origin": "https://evil.test"})
        assert stranger.status_code == 403
        assert "access-control-allow-origin" not in stranger.headers


async def test_the_codec_server_says_what_it_cannot_decode() -> None:
    client, _ = await _server_and_sealed()
    foreign = await EncryptionCodec(("k9", os.urandom(32))).encode([_plain(HOSTNAME)])
    async with client:
        answer = await client.post("/decode", json=_document(foreign), headers={"Authorization": f"Bearer {SECRET}"})
        assert answer.status_code == 400 and "'k9'" in answer.json()["error"]
        junk = await client.post("/decode", content=b"{not json", headers={"Authorization": f"Bearer {SECRET}"})
        assert junk.status_code == 400
        assert (await client.get("/decode")).status_code == 404
