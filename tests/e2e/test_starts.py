"""How certflow starts a Certificate workflow (certflow/product/starts.py), on the real
Temporal dev server: with the design it asks for and the search attributes of a
requested row, and without the attributes on a namespace that has not registered
them (the worker could not register them either: its workflows run without).

No worker polls these task queues: the starts alone are looked at, then the
workflows are terminated. The namespace without certflow's attributes is the
session server's ``leak-lab`` (only tests/e2e/test_leak_detector.py uses it, and
registers an attribute of its own).
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from certflow import search
from certflow.contract import CERTIFICATE_DESIGN, workflow_id_for
from certflow.hostnames import as_hostname
from certflow.search import register_search_attributes
from certflow.product.starts import CertificateStarts
from certflow.workflow_payloads import CertificateInput
from devstack import servers
from tests.conftest import LEAK_LAB_NAMESPACE

pytestmark = pytest.mark.e2e


async def _started_input(handle: WorkflowHandle[object, object]) -> CertificateInput:
    history = await handle.fetch_history()
    payload = history.events[0].workflow_execution_started_event_attributes.input.payloads[0]
    return CertificateInput.model_validate_json(payload.data)


async def test_a_start_asks_for_the_design_and_shows_the_requested_row(
    temporal: servers.TemporalDevServer,
) -> None:
    client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
    assert await register_search_attributes(client, "default")
    starts = CertificateStarts(client, f"starts-{uuid.uuid4().hex[:8]}")
    hostname = as_hostname(f"s-{uuid.uuid4().hex[:8]}.example.com")
    await starts.start(hostname, "tenant-s")
    handle = client.get_workflow_handle(workflow_id_for(hostname))
    try:
        attributes = (await handle.describe()).typed_search_attributes
        assert attributes.get(search.STATUS) == "PENDING"
        assert attributes.get(search.HOSTNAME) == hostname
        assert attributes.get(search.TENANT) == "tenant-s"
        assert (await _started_input(handle)).design == CERTIFICATE_DESIGN
    finally:
        with contextlib.suppress(RPCError):  # not started: the failure above says why
            await handle.terminate("test over")


async def test_a_namespace_without_the_attributes_gets_starts_without_them(
    temporal: servers.TemporalDevServer,
) -> None:
    """The first start is refused for its attributes, tried again without them, and
    later starts go without at once. Shown red: with ``CertificateStarts.start``
    re-raising every refusal, ``request`` failed on such a namespace."""
    client = await Client.connect(
        temporal.address, namespace=LEAK_LAB_NAMESPACE, data_converter=pydantic_data_converter
    )
    starts = CertificateStarts(client, f"starts-{uuid.uuid4().hex[:8]}")
    hostnames = [as_hostname(f"n{i}-{uuid.uuid4().hex[:8]}.example.com") for i in range(2)]
    handles = [client.get_workflow_handle(workflow_id_for(h)) for h in hostnames]
    try:
        for hostname in hostnames:
            await starts.start(hostname, "tenant-n")
        for handle in handles:
            assert (await handle.describe()).typed_search_attributes.get(search.STATUS) is None
            assert (await _started_input(handle)).design == CERTIFICATE_DESIGN
    finally:
        for handle in handles:
            with contextlib.suppress(RPCError):
                await handle.terminate("test over")
