"""The Certificate workflow with the payload codec on (time-skipping server): its
history holds no readable payload, replays with the key, and says which key it
lacks without it; the recorded histories from before the codec replay with it on.

Red when the codec stops encrypting (``EncryptionCodec.encode`` returning its
input: the history scan finds the hostname and the tenant; checked once) or when
plaintext payloads stop passing through decoding (every recorded history fails
to replay)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from certflow.connect.payload_codec import ENCODING, data_converter
from certflow.connect.settings import PayloadSettings
from certflow.workflow_payloads import CertificateInput
from tests.history_payloads import encodings, readable_payloads
from workflows.certificate import CertificateWorkflow

from .conftest import find_test_server
from .fakes import HOSTNAME, Fakes, started
from .test_replay import HISTORIES

TENANT = "tenant-secret-42"


def _settings(key: bytes, key_id: str = "prod-1") -> PayloadSettings:
    return PayloadSettings(payload_key=f"{key_id}:{base64.b64encode(key).decode()}")  # type: ignore[arg-type]


ENCRYPTING = data_converter(_settings(bytes(range(32))))


async def test_a_certificate_history_holds_no_readable_payload(caplog: pytest.LogCaptureFixture) -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_test_server(), data_converter=ENCRYPTING
    )
    try:
        fakes = Fakes(env)
        async with started(env, fakes, CertificateInput(hostname=HOSTNAME, tenant_id=TENANT)) as run:
            await run.until_active()
            history = await run.handle.fetch_history()
    finally:
        await env.shutdown()
    assert readable_payloads(history.events, [HOSTNAME, TENANT, "acme"]) == []
    assert encodings(history.events) == {ENCODING}

    replayed = await Replayer(workflows=[CertificateWorkflow], data_converter=ENCRYPTING).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None

    other_key = data_converter(_settings(bytes(32), key_id="other"))
    refused = await Replayer(workflows=[CertificateWorkflow], data_converter=other_key).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert refused.replay_failure is not None
    # The workflow task fails (and would be retried by a worker once the key is
    # there); the worker's log names the key id it lacks.
    assert "a payload is encrypted with key id 'prod-1'" in caplog.text


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_histories_from_before_the_codec_replay_with_it_on(path: Path) -> None:
    history = WorkflowHistory.from_json(f"certificate:{path.stem}", path.read_text())
    replayer = Replayer(workflows=[CertificateWorkflow], data_converter=ENCRYPTING)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
