"""The demo on embedded defaults: every server local, three certificates issued.

Starts embedded Postgres (or uses ``CERTFLOW_DATABASE_URL``), a Temporal dev
server with its Web UI, Pebble and pebble-challtestsrv on free ports, and a
worker; points the demo hostnames' CNAMEs at the edge; requests them; prints
the result and, while it keeps running, the ``export`` line that points the CLI
at it. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from devstack import servers
from certflow.connect.settings import ClientSettings

DEMO_HOSTNAMES = ("shop.customer-one.test", "trust.customer-two.test", "www.customer-three.test")
DEMO_CNAME_TARGET = "custom.certflow-demo.test"
DEMO_WAIT_SECONDS = 120.0
TEMPORAL_UI_PORT = 8233


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


CLIENT_VARIABLES = ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE")
"""What ClientSettings reads that the demo does not leave at its default."""
EXAMPLE_COMMAND = ".venv/bin/python starter.py list"


def client_exports(env: dict[str, str]) -> str:
    """The lines a newcomer pastes into another shell to point the CLI (and
    CertflowClient) at the running demo: its frontend port is a free one."""
    exports = " ".join(f"{name}={shlex.quote(env[name])}" for name in CLIENT_VARIABLES)
    return (
        "\nTo use the CLI against this demo, paste in another shell (from this directory):\n"
        f"export {exports}\n"
        f"{EXAMPLE_COMMAND}"
    )


def run_demo(*, keep_running: bool = True) -> int:
    """Run the demo; returns the process exit code (0 when all three are ACTIVE)."""
    from certflow.product.client import CertflowClient
    from certflow.product.tables import print_table

    workdir = Path(tempfile.mkdtemp(prefix="certflow-demo-"))
    stopping: list[object] = []
    os.environ.update(servers.without_ambient_temporal())  # the local dev server, in plaintext
    try:
        print(f"certflow demo: starting local servers (logs in {workdir})", flush=True)
        database_url = os.environ.get("CERTFLOW_DATABASE_URL")
        if not database_url:
            postgres = servers.start_embedded_postgres(workdir / "postgres")
            stopping.append(postgres)
            database_url = servers.create_database(postgres.url, "certflow")
        ui_port = TEMPORAL_UI_PORT if _port_free(TEMPORAL_UI_PORT) else None
        temporal = servers.start_temporal(workdir / "temporal", ui=True, ui_port=ui_port)
        stopping.append(temporal)
        pebble = servers.start_pebble(workdir / "pebble")
        stopping.append(pebble)
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=database_url,
            encryption_key=base64.b64encode(secrets.token_bytes(32)).decode(),
            cname_target=DEMO_CNAME_TARGET,
        )
        worker = servers.start_worker(workdir / "worker", env)
        stopping.append(worker)
        for hostname in DEMO_HOSTNAMES:
            pebble.set_cname(hostname, DEMO_CNAME_TARGET)

        async def request() -> bool:
            client = await CertflowClient.connect(
                ClientSettings(database_url=database_url, temporal_address=temporal.address)
            )
            try:
                started = time.monotonic()
                hostnames = await client.request(DEMO_HOSTNAMES, tenant_id="demo")
                print(f"requested {len(hostnames)} certificates; waiting…", flush=True)
                reports = await client.wait(hostnames, DEMO_WAIT_SECONDS)
                print(f"\nafter {time.monotonic() - started:.1f} s:")
                print_table(list(reports.values()), hostnames)
                return all(r is not None and r.status == "ACTIVE" for r in reports.values())
            finally:
                await client.close()

        all_active = asyncio.run(request())
        print(f"\nTemporal UI: {temporal.ui_url}  (workflows certificate:<hostname>)")
        print(f"Postgres:    {database_url}")
        if keep_running:
            # Blocked before saying so: a signal sent as soon as the line is read waits.
            stop_signals = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
            print(client_exports(env), flush=True)
            print("Running; press Ctrl-C to stop everything.", flush=True)
            signal.sigwait(stop_signals)
            print("stopping…", flush=True)
        return 0 if all_active else 1
    except servers.StackError as err:
        print(f"certflow demo: {err}", file=sys.stderr)
        return 1
    finally:
        for server in reversed(stopping):
            server.stop()  # type: ignore[attr-defined]
        shutil.rmtree(workdir, ignore_errors=True)
