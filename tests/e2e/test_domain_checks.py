"""A status page that polls a pending hostname's methods shares one DomainCheck:
calls in flight share it, a finished one answers for FRESH_SECONDS, and only the
"verify" button (``check``) or an older one starts another.

Red when ``status(methods=True)`` starts its own check each call (``check_now``
in place of ``recent_check``: no run under the shared id, describe finds none;
checked once)."""

from __future__ import annotations

import asyncio

import pytest

from certflow.product.client import CertflowClient
from certflow.product.domain_checks import recent_check, shared_check_id
from tests.e2e.conftest import Deployment
from tests.e2e.fault_fixtures import wait_for

pytestmark = pytest.mark.e2e


async def test_status_pages_share_one_recent_check(deployment: Deployment, client: CertflowClient) -> None:
    hostname = deployment.bare_hostname("pending")  # no DNS: PENDING, with methods to show
    await client.request([hostname], tenant_id="t-status")
    await wait_for(client, hostname, lambda r: r.error_code is not None, timeout=60)

    states = await asyncio.gather(*(client.status(hostname, methods=True) for _ in range(5)))
    assert all(s is not None and s.methods for s in states), states
    shared = client.temporal.get_workflow_handle(shared_check_id(hostname, "t-status"))
    first = (await shared.describe()).run_id
    again = await client.status(hostname, methods=True)
    assert again is not None and again.methods == states[0].methods  # type: ignore[union-attr]
    assert (await shared.describe()).run_id == first, "a fresh check was started again"

    await recent_check(client.temporal, client.task_queue, hostname, "t-status", fresh_seconds=0)
    assert (await shared.describe()).run_id != first, "an old check is not run again"
    other_tenant = client.temporal.get_workflow_handle(shared_check_id(hostname, "t-other"))
    assert other_tenant.id != shared.id
