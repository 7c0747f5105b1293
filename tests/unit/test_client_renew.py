"""``CertflowClient.renew`` right after an issuance: the row (the system of record)
is ACTIVE one workflow task before the workflow knows, and the run that stored it
refuses a renew until its next run waits for the renewal time. The client asks
again once the workflow shows the row; a refusal for any other reason stands.

Fakes stand in for Postgres and Temporal: what is tested is the client's decision.
Shown red: with ``renew`` reduced to one ``_update`` (the code before this test),
the first case raised the workflow's refusal ("is PROVISIONING"), as
tests/e2e/test_replaces_refusals.py did once in a clean-clone run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from certflow.product import client as client_module
from certflow.product.client import CertflowClient
from certflow.errors import ActionRejectedError
from certflow.store import requests
from certflow.models import CertificateStatus, Phase
from certflow.workflow_payloads import CertificateState, TransferRequest
from certflow.hostnames import as_hostname

HOST = as_hostname("shop.example.com")


def _state(status: CertificateStatus, phase: Phase | None = None) -> CertificateState:
    return CertificateState(hostname=HOST, status=status, phase=phase)


class _Handle:
    def __init__(self, shown: Iterator[CertificateState]) -> None:
        self._shown = shown
        self.queries = 0

    async def query(self, name: str, result_type: Any = None) -> CertificateState:
        assert name == "status"
        self.queries += 1
        return next(self._shown)


class _Client(CertflowClient):
    """The real ``renew`` over a scripted row, status query and update answers."""

    def __init__(self, row: CertificateState, shown: list[CertificateState], refusals: int) -> None:
        self.row = row
        self.handle_ = _Handle(itertools.chain(shown, itertools.repeat(shown[-1])))
        self.refusals = refusals
        self.updates = 0

    def handle(self, hostname: str) -> Any:
        return self.handle_

    async def _update(
        self, hostname: str, update: str, arg: TransferRequest | None = None
    ) -> CertificateState:
        assert update == "renew" and arg is None
        self.updates += 1
        if self.updates <= self.refusals:
            raise ActionRejectedError(f"nothing to renew: {hostname} is PROVISIONING")
        return _state(CertificateStatus.RENEWING)


@pytest.fixture(autouse=True)
def _scripted_row(monkeypatch: pytest.MonkeyPatch) -> None:
    async def certificate_state(pool: Any, hostname: str) -> CertificateState:
        return pool.row  # type: ignore[no-any-return]

    monkeypatch.setattr(requests, "certificate_state", certificate_state)
    monkeypatch.setattr(client_module, "CATCH_UP_POLL_SECONDS", 0.0)


def _client(row: CertificateState, shown: list[CertificateState], refusals: int = 1) -> _Client:
    made = _Client(row, shown, refusals)
    made.pool = made  # the scripted certificate_state reads .row
    return made


async def test_a_row_just_turned_active_is_renewed_once_the_workflow_shows_it() -> None:
    behind = [
        _state(CertificateStatus.PROVISIONING, Phase.FINALIZING),
        _state(CertificateStatus.ACTIVE, Phase.ISSUED),  # still the run that issued
        _state(CertificateStatus.ACTIVE, Phase.WAITING_FOR_RENEWAL),
    ]
    client = _client(_state(CertificateStatus.ACTIVE), behind)
    answered = await client.renew(HOST)
    assert answered.status is CertificateStatus.RENEWING
    assert client.updates == 2 and client.handle_.queries == 3


async def test_a_row_not_active_keeps_the_refusal() -> None:
    client = _client(_state(CertificateStatus.FAILED), [_state(CertificateStatus.FAILED)])
    with pytest.raises(ActionRejectedError, match="nothing to renew"):
        await client.renew(HOST)
    assert client.updates == 1 and client.handle_.queries == 0


async def test_a_workflow_that_never_catches_up_keeps_the_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "CATCH_UP_SECONDS", 0.05)
    stuck = [_state(CertificateStatus.PROVISIONING, Phase.FINALIZING)]
    client = _client(_state(CertificateStatus.ACTIVE), stuck)
    with pytest.raises(ActionRejectedError, match="nothing to renew"):
        await client.renew(HOST)
    assert client.updates == 1 and client.handle_.queries >= 1
