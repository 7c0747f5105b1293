"""A new hostname's HTTP-01 validation through each shipped edge's port 80:
Pebble → HAProxy, nginx or Caddy → the worker's responder.

A Pebble of its own whose VA fetches on the port the edge's port-80 listener
holds, and a worker whose responder listens elsewhere: the only way from the CA
(and from the worker's own self-check, which fetches where the CA will) to the
responder is the edge's route for ``/.well-known/acme-challenge/``. Each edge is
started in turn on that port with its configuration as shipped.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from certflow.product.client import CertflowClient
from certflow.hostnames import as_hostname
from certflow.connect.settings import ClientSettings
from devstack import caddy as devcaddy
from devstack import haproxy as devhaproxy
from devstack import nginx as devnginx
from devstack import servers
from devstack.servers import free_port
from tests.e2e.conftest import CNAME_TARGET
from tests.e2e.test_edge_files import DEFAULT_KEY, DEFAULT_PEM

pytestmark = pytest.mark.e2e

ISSUE_WAIT = 90.0


@dataclass
class BehindEdge:
    pebble: servers.PebbleStack
    env: dict[str, str]
    responder: str
    """Where the worker's responder listens: not where Pebble fetches."""
    workdir: Path


@pytest.fixture(scope="module")
def behind_edge(
    temporal: servers.TemporalDevServer,
    new_database: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BehindEdge]:
    pebble = servers.start_pebble(tmp_path_factory.mktemp("edge-pebble"), nonce_reject_percent=0)
    responder = f"127.0.0.1:{free_port()}"
    env = servers.certflow_environment(
        pebble=pebble,
        temporal_address=temporal.address,
        database_url=new_database(),
        encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
        cname_target=CNAME_TARGET,
        task_queue=f"certflow-edge80-{uuid.uuid4().hex[:6]}",
        # The self-check keeps CERTFLOW_HTTP01_SELF_CHECK_PORT, Pebble's port: the edge's.
        extra={"CERTFLOW_HTTP01_LISTEN": responder},
    )
    worker = servers.start_worker(tmp_path_factory.mktemp("edge-worker"), env)
    try:
        yield BehindEdge(pebble, env, responder, tmp_path_factory.mktemp("edges"))
    finally:
        worker.stop()
        pebble.stop()


def _start_edge(kind: str, behind: BehindEdge) -> Callable[[], None]:
    """The edge of ``kind`` with its port 80 on Pebble's HTTP-01 port; its stop."""
    port, workdir = behind.pebble.http01_port, behind.workdir / kind
    default = DEFAULT_PEM + DEFAULT_KEY
    if kind == "haproxy":
        return devhaproxy.start_haproxy(workdir, default_pem=default, responder=behind.responder, http_port=port).stop
    if kind == "nginx":
        workdir.mkdir(parents=True)
        workdir.chmod(0o711)
        (workdir / "edge").mkdir()
        return devnginx.start_nginx(
            workdir / "nginx", edge_dir=workdir / "edge", default_pem=default, responder=behind.responder,
            http_port=port,
        ).stop
    return devcaddy.start_caddy(
        workdir, edge=f"127.0.0.1:{free_port()}", secret=secrets.token_hex(16), default_pem=default,
        responder=behind.responder, http_port=port,
    ).stop


@pytest.mark.parametrize("kind", ["haproxy", "nginx", "caddy"])
async def test_the_ca_validates_through_the_edge(kind: str, behind_edge: BehindEdge) -> None:
    """Requested, ACTIVE: Pebble's VA fetched the token through the edge's port 80
    and got the key authorization (and so did the worker's self-check first). Red
    without the edge's route to the responder (shown for HAProxy: the
    ``use_backend certflow_responder`` line removed, the challenge got the https
    redirect instead of the token: the certificate stayed PENDING, waiting, the
    self-check having refused to hand the CA a challenge it would fail)."""
    stop = _start_edge(kind, behind_edge)
    client = await CertflowClient.connect(
        ClientSettings(
            database_url=behind_edge.env["CERTFLOW_DATABASE_URL"],
            temporal_address=behind_edge.env["CERTFLOW_TEMPORAL_ADDRESS"],
            task_queue=behind_edge.env["CERTFLOW_TASK_QUEUE"],
        )
    )
    try:
        hostname = as_hostname(f"{kind}.c{uuid.uuid4().hex[:10]}.test")
        behind_edge.pebble.set_cname(hostname, CNAME_TARGET)
        await client.request([hostname])
        report = (await client.wait([hostname], ISSUE_WAIT))[hostname]
        assert report is not None and report.status == "ACTIVE", report
    finally:
        await client.close()
        stop()
