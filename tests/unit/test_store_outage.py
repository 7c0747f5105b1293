"""The worker's StoreOutageInterceptor: a Postgres outage met by any activity
reaches the workflow typed (StoreUnavailableError: ACME_TEMPORARY, retried as a
short fault, ``store_unavailable`` in its data), and nothing else is touched.

Shown red: with ``store_unavailable`` answering False (no interceptor, as
before), the outage reached the workflow as a bare ConnectionDoesNotExistError.
The workflow's side (such an attempt not charged) is
tests/workflows/test_certificate_workflow.py::test_a_postgres_outage_does_not_spend_the_budget.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from activities.store_outage import StoreOutageInterceptor
from certflow.errors import ErrorCode


class _Raising(ActivityInboundInterceptor):
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        raise self.error


async def _run(error: BaseException) -> BaseException:
    inbound = StoreOutageInterceptor().intercept_activity(_Raising(error))
    with pytest.raises(BaseException) as caught:
        await inbound.execute_activity(ExecuteActivityInput(fn=print, args=(), executor=None, headers={}))
    return caught.value


async def _connect_error(url: str) -> BaseException:
    """What asyncpg's connect raises for ``url`` (nobody there)."""
    with pytest.raises(OSError) as caught:
        await asyncpg.connect(url, timeout=5)
    return caught.value


@pytest.mark.parametrize(
    "outage",
    [
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        pytest.param("postgresql://postgres@127.0.0.1:1/certflow", id="connect-refused"),
        pytest.param(
            "postgresql://postgres@/certflow?host=/nonexistent-socket-dir", id="connect-no-socket-file"
        ),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_a_postgres_outage_reaches_the_workflow_typed(outage: BaseException | str) -> None:
    if isinstance(outage, str):
        outage = await _connect_error(outage)
    raised = await _run(outage)
    assert isinstance(raised, ApplicationError), repr(raised)
    assert raised.type == str(ErrorCode.ACME_TEMPORARY) and not raised.non_retryable
    [details] = raised.details
    assert details["store_unavailable"] is True
    assert details["message"].startswith(f"Postgres did not answer: {type(outage).__name__}: ")


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.UniqueViolationError("duplicate key value violates unique constraint"),
        ApplicationError("the CA answered 503", type="ACME_TEMPORARY"),
        ValueError("a bug"),
        FileNotFoundError(2, "No such file or directory"),  # not raised through asyncpg
    ],
    ids=lambda e: type(e).__name__,
)
async def test_anything_else_passes_untouched(error: BaseException) -> None:
    assert await _run(error) is error
