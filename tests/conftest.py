"""Real servers shared by the test session: Postgres, Temporal, Pebble + challtestsrv.

Postgres is the one at ``DATABASE_URL`` when set (a fresh database is created
in it), otherwise an embedded server in a temporary directory.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack import servers

# The servers here are local and plaintext: a developer's own Temporal settings
# (a Temporal Cloud API key, a profile file) must not reach the clients the
# tests build in this process. Tests that want TLS set it explicitly.
os.environ.update(servers.without_ambient_temporal())


@pytest.fixture(scope="session")
def postgres_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    server = servers.start_embedded_postgres(tmp_path_factory.mktemp("postgres"))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def new_database(postgres_admin_url: str) -> Iterator[object]:
    """A factory of fresh, empty databases (dropped at the end of the session)."""
    created: list[str] = []

    def make(prefix: str = "certflow_test") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        created.append(name)
        return servers.create_database(postgres_admin_url, name)

    yield make


@pytest.fixture(scope="session")
def pebble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.PebbleStack]:
    stack = servers.start_pebble(tmp_path_factory.mktemp("pebble"), nonce_reject_percent=5)
    try:
        yield stack
    finally:
        stack.stop()


LEAK_LAB_NAMESPACE = "leak-lab"
"""Where tests/e2e/test_leak_detector.py plants its leaks: not in the namespace that
the product-path leak test scans whole, whatever order the tests run in."""


@pytest.fixture(scope="session")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.TemporalDevServer]:
    server = servers.start_temporal(
        tmp_path_factory.mktemp("temporal"), extra_args=["--namespace", LEAK_LAB_NAMESPACE]
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
