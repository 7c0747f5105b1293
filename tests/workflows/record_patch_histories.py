"""Record the histories that prove a patch keeps old runs replaying.

    .venv/bin/python -m tests.workflows.record_patch_histories [SUFFIX]

Runs the scenarios a ``workflow.patched()`` guards on the time-skipping test
server with the fakes (no real server produces them on demand) and writes each
history to tests/workflows/histories/<scenario>[-SUFFIX]-1.json. Record once on
the code before the patch (with a suffix such as ``unpatched``) and once after:
test_replay.py replays both on today's code.
"""

from __future__ import annotations

import asyncio
import json
import sys

from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.workflows.conftest import find_test_server
from tests.workflows.fakes import Fakes, started
from tests.workflows.record_histories import HISTORIES
from tests.workflows.test_certificate_workflow import stored_but_result_lost


async def _row_moved_on(env: WorkflowEnvironment, name: str) -> None:
    """finalize_and_store stored the certificate but its result was lost."""
    fakes = Fakes(env)
    fakes.behaviours["finalize_and_store"] = stored_but_result_lost(fakes)
    async with started(env, fakes) as run:
        await asyncio.sleep(3)  # the old code ends by then; the patched one waits to renew
        if (await run.handle.describe()).status is WorkflowExecutionStatus.RUNNING:
            await run.cancel()
        else:
            await run.result()
        history = await run.handle.fetch_history()
    path = HISTORIES / f"{name}-1.json"
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    print(f"wrote {path.name} ({len(history.events)} events)")


async def _main(suffix: str) -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_test_server(), data_converter=pydantic_data_converter
    )
    try:
        await _row_moved_on(env, "row-moved-on" + (f"-{suffix}" if suffix else ""))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else ""))
