"""The leak detector (tests/leaks.py) can fail: every place the suite promises holds
no private key gets a key planted on a real server, and the detector must name it.

Temporal (the session's dev server): a test-only worker runs in this process on a
task queue of its own, with the pydantic data converter like the product, and
plants a PEM private key in an activity result; in the first run only of a
workflow that then continues as new (the detector is given a query that lists the
running, clean run only, so it must follow the run links); in a child workflow's
input (the query lists the parent only); in a signal argument and an update
result; in a memo; in an activity failure's message. Postgres (a fresh database):
a PEM in a ``bytea`` column of a table in a non-public schema, the DER as hex in
a ``text`` column, a JWK in ``jsonb``. Logs: a DEBUG line with the key, JSON and
plain text. The negative control runs the same workflows, tables and logs with
the key's own certificate (and an RSA key's certificate, whose PEM shares long
public runs with the key's PEM) instead: nothing may be found, while the
detector must still have read every run and payload.

The planted keys reach workflows through a dict in this process (``_SECRETS``),
so a value sits only where the scenario puts it; the worker runs unsandboxed
for that reason (the sandbox would re-import this module with an empty dict).

In the product path, once (then reverted exactly: the file compared equal to a
copy taken before): ``AcmeActivities._finalize_and_store`` in
certflow/acme/orders.py (since in certflow/acme/finalize.py) was made to log the new key at INFO
(``activity.logger.info("stored key %s", private_key_to_pem(key).decode())``;
the deployment's worker logs at INFO, so a DEBUG line would never be written)
and to return the private scalar as hex appended to ``serial_hex``. With that
worker, tests/e2e/test_issuance.py's
``test_no_key_material_in_workflows_tables_or_logs`` failed, naming for each of
its two certificates the ``finalize_and_store`` result payload (``event 35
ActivityTaskCompleted`` of the issuing run: "the private scalar of key N (hex)"),
the ``StartChildWorkflowExecutionInitiated`` input of the webhook child, that
child's ``WorkflowExecutionStarted`` input and its delivery activity's
``ActivityTaskScheduled`` input (found only by following the child link), and
the worker log's lines ("a PEM private key header, PEM body line 1 of key N").
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from temporalio import activity, workflow
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from devstack import servers
from certflow.running.logs import JsonFormatter
from tests.leaks import Findings, key_needles, log_leaks, scan_bytes, table_leaks, workflow_leaks
from tests.conftest import LEAK_LAB_NAMESPACE

pytestmark = pytest.mark.e2e

WAIT = 30.0
TIMEOUT = timedelta(seconds=30)

# ------------------------------------------------------------------ keys and certificates


@dataclass(frozen=True)
class Material:
    """An EC and an RSA key with their self-signed certificates."""

    ec_key: ec.EllipticCurvePrivateKey
    rsa_key: rsa.RSAPrivateKey
    ec_cert: x509.Certificate
    rsa_cert: x509.Certificate

    @property
    def key_pem(self) -> str:
        return self.ec_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()

    @property
    def key_der(self) -> bytes:
        return self.ec_key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def certificates_pem(self) -> str:
        """Both certificates, as a chain would be stored (nothing secret)."""
        return "".join(
            c.public_bytes(serialization.Encoding.PEM).decode() for c in (self.ec_cert, self.rsa_cert)
        )

    @property
    def needles(self) -> list[bytes]:
        return key_needles(self.ec_key, self.rsa_key)


def _self_signed(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, name: str) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=90))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )


@pytest.fixture(scope="module")
def material() -> Material:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return Material(
        ec_key, rsa_key, _self_signed(ec_key, "ec.leak.test"), _self_signed(rsa_key, "rsa.leak.test")
    )


# ------------------------------------------------------------------ the test-only workflows

_SECRETS: dict[str, str] = {}
"""Planted values by token: what activities and workflows of this process return."""


def _plant(value: str) -> str:
    token = uuid.uuid4().hex
    _SECRETS[token] = value
    return token


@activity.defn
async def reveal(token: str) -> str:
    return _SECRETS[token]


@activity.defn
async def refuse(token: str) -> None:
    raise ApplicationError(_SECRETS[token], type="Planted", non_retryable=True)


@workflow.defn
class ActivityResultWorkflow:
    @workflow.run
    async def run(self, token: str) -> None:
        await workflow.execute_activity(reveal, token, start_to_close_timeout=TIMEOUT)


@workflow.defn
class FirstRunWorkflow:
    """Run 1 gets the value as an activity result and continues as new without it;
    run 2 holds nothing and waits for ``finish``."""

    def __init__(self) -> None:
        self._finish = False

    @workflow.run
    async def run(self, token: str | None) -> None:
        if token is not None:
            await workflow.execute_activity(reveal, token, start_to_close_timeout=TIMEOUT)
            workflow.continue_as_new(None)
        await workflow.wait_condition(lambda: self._finish)

    @workflow.signal
    def finish(self) -> None:
        self._finish = True


@workflow.defn
class ChildWorkflow:
    @workflow.run
    async def run(self, value: str) -> int:
        return len(value)


@workflow.defn
class ParentWorkflow:
    """Starts ``<own id>/child`` with the value as its input."""

    @workflow.run
    async def run(self, token: str) -> None:
        await workflow.execute_child_workflow(
            ChildWorkflow.run, _SECRETS[token], id=f"{workflow.info().workflow_id}/child"
        )


@workflow.defn
class InboxWorkflow:
    def __init__(self) -> None:
        self._notes = 0
        self._finish = False

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self._finish)
        return self._notes

    @workflow.signal
    def note(self, text: str) -> None:
        self._notes += 1

    @workflow.update
    def reveal(self, token: str) -> str:
        return _SECRETS[token]

    @workflow.signal
    def finish(self) -> None:
        self._finish = True


_RELEASED: set[str] = set()


@activity.defn
async def heartbeat_and_wait(token: str) -> None:
    """Heartbeats the value, then waits (pending, its details on the server) until
    the test releases it."""
    activity.heartbeat(_SECRETS[token])
    while token not in _RELEASED:
        await asyncio.sleep(0.05)


@workflow.defn
class HeartbeatWorkflow:
    @workflow.run
    async def run(self, token: str) -> None:
        await workflow.execute_activity(
            heartbeat_and_wait, token, start_to_close_timeout=TIMEOUT, heartbeat_timeout=TIMEOUT
        )


@workflow.defn
class CarryOverWorkflow:
    """Run 1 continues as new with the value as the next run's input; run 2 ends."""

    @workflow.run
    async def run(self, token: str, value: str | None = None) -> None:
        if value is None:
            workflow.continue_as_new(args=[token, _SECRETS[token]])


TEXT_ATTRIBUTE = SearchAttributeKey.for_text("LeakDetectorText")


@workflow.defn
class AttributeWorkflow:
    @workflow.run
    async def run(self, token: str) -> None:
        workflow.upsert_search_attributes([TEXT_ATTRIBUTE.value_set(_SECRETS[token])])


@workflow.defn
class QuietWorkflow:
    @workflow.run
    async def run(self) -> None:
        return None


@workflow.defn
class FailureWorkflow:
    @workflow.run
    async def run(self, token: str) -> bool:
        try:
            await workflow.execute_activity(
                refuse, token, start_to_close_timeout=TIMEOUT, retry_policy=RetryPolicy(maximum_attempts=1)
            )
        except ActivityError:
            return True
        return False


@dataclass
class Lab:
    client: Client
    task_queue: str

    def workflow_id(self, scenario: str) -> str:
        return f"leak-detector-{scenario}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
async def lab(temporal: servers.TemporalDevServer) -> AsyncIterator[Lab]:
    client = await Client.connect(
        temporal.address, namespace=LEAK_LAB_NAMESPACE, data_converter=pydantic_data_converter
    )
    task_queue = f"leak-detector-{uuid.uuid4().hex[:8]}"
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={TEXT_ATTRIBUTE.name: IndexedValueType.INDEXED_VALUE_TYPE_TEXT},
        )
    )
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[
            ActivityResultWorkflow, FirstRunWorkflow, ChildWorkflow, ParentWorkflow,
            InboxWorkflow, QuietWorkflow, FailureWorkflow, HeartbeatWorkflow,
            CarryOverWorkflow, AttributeWorkflow,
        ],
        activities=[reveal, refuse, heartbeat_and_wait],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    async with worker:
        yield Lab(client, task_queue)


async def _until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = WAIT) -> None:
    """Wait until ``await check()`` is true (condition polling, with a deadline)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def _listed(client: Client, query: str) -> set[tuple[str, str]]:
    return {(e.id, e.run_id) async for e in client.list_workflows(query)}


async def _visible(client: Client, query: str, runs: set[tuple[str, str]]) -> None:
    """Wait until the visibility query lists exactly these runs."""

    async def check() -> bool:
        return await _listed(client, query) == runs

    await _until(f"{query} lists {sorted(runs)}", check)


# ------------------------------------------------------------------ scenarios


@dataclass
class Planted:
    """A scenario's workflows, settled: the query that lists what the detector is given,
    the runs it must read, and where each finding must be (workflow id, run id, event)."""

    query: str
    runs: set[tuple[str, str]]
    spots: list[tuple[str, str, str]]
    extra: dict[str, str] = field(default_factory=dict)


async def _activity_result(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("result")
    handle = await lab.client.start_workflow(
        ActivityResultWorkflow.run, _plant(value), id=workflow_id, task_queue=lab.task_queue
    )
    await handle.result()
    run = (workflow_id, handle.first_execution_run_id or "")
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, {run})
    return Planted(query, {run}, [(*run, "ActivityTaskCompleted")])


async def _first_run_only(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("first-run")
    handle = await lab.client.start_workflow(
        FirstRunWorkflow.run, _plant(value), id=workflow_id, task_queue=lab.task_queue
    )
    first = handle.first_execution_run_id or ""
    latest = lab.client.get_workflow_handle(workflow_id)

    async def continued() -> bool:
        return (await latest.describe()).run_id not in (None, first)

    await _until(f"{workflow_id} continued as new", continued)
    second = (await latest.describe()).run_id or ""
    runs = {(workflow_id, first), (workflow_id, second)}
    # Visibility lists each closed run of a continue-as-new chain on its own ...
    await _visible(lab.client, f'WorkflowId = "{workflow_id}"', runs)
    # ... but the detector gets a query listing only the running, clean run: it must
    # follow the history's link back to the first run.
    query = f'WorkflowId = "{workflow_id}" AND ExecutionStatus = "Running"'
    await _visible(lab.client, query, {(workflow_id, second)})
    return Planted(query, runs, [(workflow_id, first, "ActivityTaskCompleted")], {"clean run": second})


async def _finish_first_run(lab: Lab, planted: Planted) -> None:
    workflow_id = next(iter(planted.runs))[0]
    handle = lab.client.get_workflow_handle(workflow_id)
    await handle.signal(FirstRunWorkflow.finish)
    await handle.result()


async def _child_input(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("parent")
    handle = await lab.client.start_workflow(
        ParentWorkflow.run, _plant(value), id=workflow_id, task_queue=lab.task_queue
    )
    await handle.result()
    child_id = f"{workflow_id}/child"
    child = (child_id, (await lab.client.get_workflow_handle(child_id).describe()).run_id or "")
    parent = (workflow_id, handle.first_execution_run_id or "")
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, {parent})  # the child is not listed
    return Planted(
        query,
        {parent, child},
        [(*child, "WorkflowExecutionStarted"), (*parent, "StartChildWorkflowExecutionInitiated")],
    )


async def _signal_and_update(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("inbox")
    handle = await lab.client.start_workflow(InboxWorkflow.run, id=workflow_id, task_queue=lab.task_queue)
    await handle.signal(InboxWorkflow.note, value)
    assert await handle.execute_update(InboxWorkflow.reveal, _plant(value)) == value
    await handle.signal(InboxWorkflow.finish)
    assert await handle.result() == 1
    run = (workflow_id, handle.first_execution_run_id or "")
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, {run})
    return Planted(
        query, {run}, [(*run, "WorkflowExecutionSignaled"), (*run, "WorkflowExecutionUpdateCompleted")]
    )


async def _memo(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("memo")
    handle = await lab.client.start_workflow(
        QuietWorkflow.run, id=workflow_id, task_queue=lab.task_queue, memo={"note": value}
    )
    await handle.result()
    run = (workflow_id, handle.first_execution_run_id or "")
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, {run})
    return Planted(query, {run}, [(*run, "WorkflowExecutionStarted")])


async def _failure_message(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("failure")
    handle = await lab.client.start_workflow(
        FailureWorkflow.run, _plant(value), id=workflow_id, task_queue=lab.task_queue
    )
    assert await handle.result() is True
    run = (workflow_id, handle.first_execution_run_id or "")
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, {run})
    return Planted(query, {run}, [(*run, "ActivityTaskFailed")])


async def _heartbeat(lab: Lab, value: str) -> Planted:
    """A running workflow whose activity is pending with the value as its heartbeat
    details (released by :func:`_release`)."""
    workflow_id = lab.workflow_id("heartbeat")
    token = _plant(value)
    handle = await lab.client.start_workflow(
        HeartbeatWorkflow.run, token, id=workflow_id, task_queue=lab.task_queue
    )

    async def recorded() -> bool:
        pending = (await handle.describe()).raw_description.pending_activities
        return bool(pending and pending[0].heartbeat_details.payloads)

    await _until(f"{workflow_id}'s heartbeat recorded", recorded)
    run = (workflow_id, handle.first_execution_run_id or "")
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, {run})
    return Planted(query, {run}, [], {"token": token})


async def _release(lab: Lab, planted: Planted) -> None:
    _RELEASED.add(planted.extra["token"])
    workflow_id = next(iter(planted.runs))[0]
    await lab.client.get_workflow_handle(workflow_id).result()


async def _continue_as_new_input(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("carry")
    handle = await lab.client.start_workflow(
        CarryOverWorkflow.run, args=[_plant(value)], id=workflow_id, task_queue=lab.task_queue
    )
    await lab.client.get_workflow_handle(workflow_id).result()
    first = handle.first_execution_run_id or ""
    second = (await lab.client.get_workflow_handle(workflow_id).describe()).run_id or ""
    runs = {(workflow_id, first), (workflow_id, second)}
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, runs)
    return Planted(
        query,
        runs,
        [(workflow_id, first, "WorkflowExecutionContinuedAsNew"), (workflow_id, second, "WorkflowExecutionStarted")],
    )


async def _search_attribute(lab: Lab, value: str) -> Planted:
    workflow_id = lab.workflow_id("attribute")
    handle = await lab.client.start_workflow(
        AttributeWorkflow.run, _plant(value), id=workflow_id, task_queue=lab.task_queue
    )
    await handle.result()
    run = (workflow_id, handle.first_execution_run_id or "")
    query = f'WorkflowId = "{workflow_id}"'
    await _visible(lab.client, query, {run})
    return Planted(query, {run}, [(*run, "UpsertWorkflowSearchAttributes")])


def _at(findings: Findings, workflow_id: str, run_id: str, event: str) -> list[str]:
    prefix = f"workflow {workflow_id} run {run_id} event "
    return [f for f in findings if f.startswith(prefix) and f" {event}:" in f]


async def _detect(lab: Lab, planted: Planted, material: Material) -> Findings:
    findings = await workflow_leaks(lab.client, key_needles(material.ec_key), query=planted.query)
    assert planted.runs <= findings.runs, findings.summary()
    for spot in planted.spots:
        assert _at(findings, *spot), f"nothing found at {spot}:\n" + "\n".join(findings)
    return findings


# ------------------------------------------------------------------ temporal: planted faults


async def test_a_key_in_an_activity_result_is_found(lab: Lab, material: Material) -> None:
    planted = await _activity_result(lab, material.key_pem)
    findings = await _detect(lab, planted, material)
    (finding,) = _at(findings, *planted.spots[0])
    assert "payload activity_task_completed_event_attributes.result.payloads[0]" in finding
    assert "a PEM private key header" in finding and "PEM body line 1 of key 1" in finding


async def test_a_key_only_in_the_first_run_before_continue_as_new_is_found(
    lab: Lab, material: Material
) -> None:
    planted = await _first_run_only(lab, material.key_pem)
    try:
        findings = await _detect(lab, planted, material)
        clean = planted.extra["clean run"]
        assert not [f for f in findings if f" run {clean} " in f], findings
        assert findings.runs == planted.runs  # both runs read, though only the latest was listed
    finally:
        await _finish_first_run(lab, planted)


async def test_a_key_only_in_a_child_workflows_input_is_found(lab: Lab, material: Material) -> None:
    """The query lists the parent only: the child's own history is read through the
    link (Temporal also echoes a child's input in the parent's
    StartChildWorkflowExecutionInitiated event; the child's finding is what counts)."""
    planted = await _child_input(lab, material.key_pem)
    findings = await _detect(lab, planted, material)
    (child_finding,) = _at(findings, *planted.spots[0])
    assert "workflow_execution_started_event_attributes.input.payloads[0]" in child_finding


async def test_a_key_in_a_signal_argument_and_in_an_update_result_is_found(
    lab: Lab, material: Material
) -> None:
    planted = await _signal_and_update(lab, material.key_pem)
    findings = await _detect(lab, planted, material)
    (signal,) = _at(findings, *planted.spots[0])
    assert "workflow_execution_signaled_event_attributes.input.payloads[0]" in signal
    (update,) = _at(findings, *planted.spots[1])
    assert "workflow_execution_update_completed_event_attributes.outcome.success.payloads[0]" in update


async def test_a_key_in_a_memo_is_found(lab: Lab, material: Material) -> None:
    planted = await _memo(lab, material.key_pem)
    findings = await _detect(lab, planted, material)
    (started,) = _at(findings, *planted.spots[0])
    assert "memo.fields['note']" in started
    assert any("visibility record: payload memo.fields['note']" in f for f in findings), findings


async def test_a_key_in_a_failure_message_is_found(lab: Lab, material: Material) -> None:
    planted = await _failure_message(lab, material.key_pem)
    findings = await _detect(lab, planted, material)
    (failed,) = _at(findings, *planted.spots[0])
    assert "activity_task_failed_event_attributes.failure.message" in failed


async def test_other_encodings_of_the_key_in_payloads_are_found(lab: Lab, material: Material) -> None:
    """Not PEM: no header to spot, only key-specific bytes (JWK ``d``, DER base64)."""
    scalar = material.ec_key.private_numbers().private_value.to_bytes(32, "big")
    jwk = json.dumps({"kty": "EC", "crv": "P-256", "d": base64.urlsafe_b64encode(scalar).decode().rstrip("=")})
    planted = await _signal_and_update(lab, jwk)
    findings = await _detect(lab, planted, material)
    assert all("PEM" not in f for f in findings)
    assert any("the private scalar of key 1" in f and "base64url" in f for f in findings), findings
    planted = await _memo(lab, base64.b64encode(material.key_der).decode())
    findings = await _detect(lab, planted, material)
    assert any("the PKCS#8 DER of key 1" in f for f in findings), findings


async def test_a_key_in_heartbeat_details_is_found(lab: Lab, material: Material) -> None:
    """A pending activity's heartbeat details (in the workflow's description)."""
    planted = await _heartbeat(lab, material.key_pem)
    try:
        findings = await _detect(lab, planted, material)
    finally:
        await _release(lab, planted)
    workflow_id, run_id = next(iter(planted.runs))
    spot = f"workflow {workflow_id} run {run_id} description: payload pending_activities[0].heartbeat_details"
    assert any(f.startswith(spot) for f in findings), findings


async def test_a_key_in_a_continue_as_new_input_is_found(lab: Lab, material: Material) -> None:
    planted = await _continue_as_new_input(lab, material.key_pem)
    await _detect(lab, planted, material)


async def test_a_key_in_a_search_attribute_is_found(lab: Lab, material: Material) -> None:
    """Search attributes are never encoded by a codec: a key there is plain text in
    the visibility store (Temporal's docs: never put secrets in search attributes)."""
    scalar = material.ec_key.private_numbers().private_value.to_bytes(32, "big")
    planted = await _search_attribute(lab, scalar.hex())
    findings = await _detect(lab, planted, material)
    assert any("visibility record" in f for f in findings), findings


async def test_a_key_in_a_schedules_arguments_is_found(lab: Lab, material: Material) -> None:
    schedule_id = lab.workflow_id("schedule")
    await lab.client.create_schedule(
        schedule_id,
        Schedule(
            action=ScheduleActionStartWorkflow(
                ChildWorkflow.run, material.key_pem, id=f"{schedule_id}-run", task_queue=lab.task_queue
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(days=365))]),
            state=ScheduleState(paused=True),
        ),
    )
    try:
        findings = await workflow_leaks(
            lab.client,
            key_needles(material.ec_key),
            query=f'WorkflowId = "{schedule_id}-none"',
            schedule_ids=[schedule_id],
        )
    finally:
        await lab.client.get_schedule_handle(schedule_id).delete()
    assert any(f.startswith(f"schedule {schedule_id} description:") for f in findings), findings


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda der: repr(der), id="repr-of-bytes"),
        pytest.param(lambda der: json.dumps(list(der)), id="list-of-ints"),
        pytest.param(lambda der: urllib.parse.quote_from_bytes(der), id="url-encoded"),
        pytest.param(lambda der: json.dumps(der.decode("latin-1")), id="json-escaped"),
    ],
)
async def test_a_key_written_as_code_writes_bytes_is_found_without_a_needle(
    lab: Lab, material: Material, encode: Callable[[bytes], str]
) -> None:
    """``%r`` of the DER in a log line, the DER as a list of byte values, URL-encoded,
    JSON-escaped: found as a private key structure, with no needle of the key given
    (a key no test captured is found too). Red before the structural search: the
    ``repr()`` line gave "0 findings"."""
    text = f"stored key {encode(material.key_der)} for shop.example.test"
    assert log_leaks(text, []), f"not found in {text[:80]}"
    planted = await _memo(lab, text)
    findings = await workflow_leaks(lab.client, [], query=planted.query)
    assert any("a DER private key (PKCS#8, EC secp256r1)" in f for f in findings), findings


# ------------------------------------------------------------------ postgres and logs: planted faults


async def _database(new_database: Callable[[], str], blob: bytes, text: str) -> str:
    url = new_database()
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            """
            CREATE SCHEMA vault;
            CREATE TABLE vault.blobs (id integer PRIMARY KEY, label text, payload bytea);
            CREATE TABLE public.notes (name text PRIMARY KEY, body text, meta jsonb);
            CREATE TABLE public.unkeyed (payload bytea);
            """
        )
        await connection.executemany(
            "INSERT INTO vault.blobs VALUES ($1, $2, $3)",
            [(1, "empty", b""), (2, "planted", blob), (3, "noise", bytes(range(256)) * 40)],
        )
        await connection.executemany(
            "INSERT INTO public.notes VALUES ($1, $2, $3)",
            [("hello", "world", '{"a": 1}'), ("der", text, None)],
        )
        await connection.execute("INSERT INTO public.unkeyed VALUES ('\\x00ff'::bytea)")
    finally:
        await connection.close()
    return url


async def test_a_pem_key_in_bytea_and_der_hex_in_text_are_found(
    new_database: Callable[[], str], material: Material
) -> None:
    url = await _database(new_database, material.key_pem.encode(), material.key_der.hex())
    findings = await table_leaks(url, key_needles(material.ec_key))
    assert {"vault.blobs", "public.notes", "public.unkeyed"} <= findings.tables
    assert findings.rows == 6
    assert len(findings) == 2, findings
    bytea = [f for f in findings if f.startswith("table vault.blobs column payload row id=2:")]
    assert bytea and "a PEM private key header" in bytea[0], findings
    text = [f for f in findings if f.startswith("table public.notes column body row name=der:")]
    assert text and "the PKCS#8 DER of key 1 (EC secp256r1) (hex)" in text[0], findings


async def test_a_key_in_jsonb_is_found_through_a_pool(
    new_database: Callable[[], str], material: Material
) -> None:
    url = await _database(new_database, b"nothing", "nothing")
    scalar = material.ec_key.private_numbers().private_value.to_bytes(32, "big")
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    assert pool is not None
    try:
        await pool.execute(
            "UPDATE public.notes SET meta = $1::jsonb WHERE name = 'hello'",
            json.dumps({"jwk": {"d": base64.urlsafe_b64encode(scalar).decode().rstrip("=")}}),
        )
        findings = await table_leaks(pool, key_needles(material.ec_key))
    finally:
        await pool.close()
    assert [f.split(":")[0] for f in findings] == ["table public.notes column meta row name=hello"]


@pytest.fixture
def debug_logs(tmp_path: Path) -> Iterator[Callable[[str], list[Path]]]:
    """Write a DEBUG line (among others) to a JSON log and a plain-text log."""
    handlers: list[logging.Handler] = []
    logger = logging.getLogger(f"leak-detector.{uuid.uuid4().hex[:6]}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

    def write(value: str) -> list[Path]:
        paths = [tmp_path / "worker.json.log", tmp_path / "worker.text.log"]
        for path, formatter in zip(
            paths, [JsonFormatter(), logging.Formatter("%(asctime)s %(levelname)s %(message)s")]
        ):
            file_handler = logging.FileHandler(path)
            file_handler.setFormatter(formatter)
            logger.addHandler(file_handler)
            handlers.append(file_handler)
        logger.info("worker started", extra={"task_queue": "x"})
        logger.debug("loaded key for shop.example.test: %s", value)
        logger.info("done")
        for handler in handlers:
            handler.flush()
        return paths

    try:
        yield write
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()


def test_a_key_in_a_debug_log_line_is_found(
    debug_logs: Callable[[str], list[Path]], material: Material
) -> None:
    json_log, text_log = debug_logs(material.key_pem)
    findings = log_leaks([json_log, text_log], key_needles(material.ec_key))
    assert findings.logs == 2
    assert any(
        f.startswith(f"log {json_log} line 2:") and "a PEM private key header" in f for f in findings
    ), findings
    assert any(f.startswith(f"log {text_log} line 2:") for f in findings), findings
    assert any(f.startswith(f"log {text_log} line 3:") and "PEM body line 1" in f for f in findings)
    # A text is searched the same way as a file.
    assert log_leaks(json_log.read_text(), key_needles(material.ec_key))


# ------------------------------------------------------------------ negative control


async def test_certificates_instead_of_keys_are_not_leaks(
    lab: Lab,
    material: Material,
    new_database: Callable[[], str],
    debug_logs: Callable[[str], list[Path]],
) -> None:
    """The same workflows, tables and logs with certificates (the keys' own, so they
    share the public key with what the needles come from): nothing found, while
    everything was read."""
    value = material.certificates_pem
    assert "-----BEGIN CERTIFICATE-----" in value
    scenarios = [
        await _activity_result(lab, value),
        await _first_run_only(lab, value),
        await _child_input(lab, value),
        await _signal_and_update(lab, value),
        await _memo(lab, value),
        await _failure_message(lab, value),
        await _heartbeat(lab, value),
        await _continue_as_new_input(lab, value),
    ]
    try:
        findings = await workflow_leaks(
            lab.client, material.needles, query=" OR ".join(f"({s.query})" for s in scenarios)
        )
    finally:
        await _finish_first_run(lab, scenarios[1])
        await _release(lab, scenarios[6])
    assert not findings, "\n".join(findings)
    expected = {run for scenario in scenarios for run in scenario.runs}
    assert expected <= findings.runs, findings.summary()
    assert findings.payloads >= 2 * len(expected), findings.summary()  # inputs, results, memo ...

    cert_der = material.ec_cert.public_bytes(serialization.Encoding.DER)
    url = await _database(new_database, value.encode(), cert_der.hex())
    tables = await table_leaks(url, material.needles)
    assert not tables, "\n".join(tables)
    assert tables.rows == 6 and tables.cells >= 10

    logs = log_leaks(debug_logs(value), material.needles)
    assert not logs, "\n".join(logs)
    assert logs.lines >= 6


def test_every_encoding_of_a_key_is_found_and_public_material_is_not(material: Material) -> None:
    """The needles without a server: each way a key could be written down is found,
    no way a certificate, CSR or public key is written down is."""
    key = material.ec_key
    needles = key_needles(key)
    specific = needles[1:]  # without the generic PEM header
    pem = material.key_pem.encode()
    der = material.key_der
    traditional = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    leaks = {
        "PEM in JSON": json.dumps({"key": pem.decode()}).encode(),
        "traditional PEM body": b"".join(traditional.splitlines()[1:-1]),
        "DER raw in noise": b"\x00\x01" + der + b"\xff",
        "DER hex upper": der.hex().upper().encode(),
        "bytea hex": b"\\x" + der.hex().encode(),
        "DER base64url, offset in a longer string": base64.urlsafe_b64encode(b"x" + der + b"yz"),
        "base64 of the PEM text": base64.b64encode(pem),
        "hex of the PEM text": pem.hex().encode(),
        "JWK d": json.dumps({"d": base64.urlsafe_b64encode(scalar).decode().rstrip("=")}).encode(),
        "scalar hex": scalar.hex().encode(),
        "scalar decimal": str(key.private_numbers().private_value).encode(),
    }
    for name, blob in leaks.items():
        assert scan_bytes(blob, specific), f"{name} not found"
    # The header alone, of a key generated here (no key text is kept in the tree).
    header = traditional.splitlines()[0]
    assert scan_bytes(header, needles) == ["a PEM private key header"]

    public = []
    for private, cert in ((material.ec_key, material.ec_cert), (material.rsa_key, material.rsa_cert)):
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        cert_der = cert.public_bytes(serialization.Encoding.DER)
        csr = x509.CertificateSigningRequestBuilder().subject_name(cert.subject).sign(private, hashes.SHA256())
        public += [
            cert_pem, cert_der, cert_der.hex().encode(), base64.b64encode(cert_pem),
            json.dumps({"chain": cert_pem.decode()}).encode(),
            csr.public_bytes(serialization.Encoding.PEM),
            private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        ]
    for blob in public:
        assert not scan_bytes(blob, material.needles), blob[:60]
