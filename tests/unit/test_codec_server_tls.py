"""The codec server with client certificates (CERTFLOW_CODEC_TLS_CLIENT_CA): a caller
with a certificate from that CA decodes; one without, or with one from another
CA, never gets an answer (the TLS layer refuses it), so no secret is needed.

Red when ``codec_server`` stops asking for the certificate (``ssl_cert_reqs``
left at CERT_NONE: the caller without one decoded; checked once)."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload

from certflow.product.codec_server import codec_server
from certflow.connect.payload_codec import EncryptionCodec
from certflow.connect.settings import CodecServerSettings, load_settings
from devstack.servers import free_port
from devstack.temporal_tls import TemporalPki, write_temporal_pki

KEY = bytes(range(32))


@pytest.fixture
async def served(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, TemporalPki]]:
    pki = write_temporal_pki(tmp_path / "pki")
    port = free_port()
    for name, value in {
        "CERTFLOW_PAYLOAD_KEY": f"k1:{base64.b64encode(KEY).decode()}",
        "CERTFLOW_CODEC_LISTEN": f"127.0.0.1:{port}",
        "CERTFLOW_CODEC_TLS_CERT": str(pki.server_cert),
        "CERTFLOW_CODEC_TLS_KEY": str(pki.server_key),
        "CERTFLOW_CODEC_TLS_CLIENT_CA": str(pki.client_ca),
    }.items():
        clean_environment.setenv(name, value)
    server = codec_server(load_settings(CodecServerSettings))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"https://127.0.0.1:{port}", pki
    finally:
        server.should_exit = True
        await task


def _context(pki: TemporalPki, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.server_ca))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


async def test_only_a_caller_with_a_client_certificate_decodes(served: tuple[str, TemporalPki]) -> None:
    url, pki = served
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"shop.customer.test"')
    sealed = (await EncryptionCodec(("k1", KEY)).encode([plain]))[0]
    body = {"payloads": [json_format.MessageToDict(sealed)]}
    async with httpx.AsyncClient(verify=_context(pki, pki.client_cert, pki.client_key)) as operator:
        answer = await operator.post(f"{url}/decode", json=body)
        assert answer.status_code == 200
        assert answer.json()["payloads"] == [json_format.MessageToDict(plain)]
    for cert, key in ((None, None), (pki.other_client_cert, pki.other_client_key)):
        async with httpx.AsyncClient(verify=_context(pki, cert, key)) as stranger:
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                await stranger.post(f"{url}/decode", json=body)
