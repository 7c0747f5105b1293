"""An issuer whose CA did not answer at start-up: registered on first use, at most
once a minute, every call failing as the CA unreachable until then."""

from __future__ import annotations

import time
from typing import Any

import pytest

from certflow.acme.account import AcmeAccount, AcmeClients
from certflow.errors import AcmeProblemError, CaUnreachableError, ErrorCode
from certflow.issuers import Issuer

ISSUER = Issuer(name="zerossl", directory_url="https://acme.test/dir", caa_domains=("sectigo.com",))


async def test_registered_on_first_use_at_most_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    tries: list[float] = []
    account: Any = AcmeAccount("https://acme.test/dir", "https://acme.test/acct/7", None, {}, True)  # type: ignore[arg-type]

    async def register() -> AcmeAccount:
        tries.append(clock[0])
        if len(tries) == 1:
            raise CaUnreachableError("CERTFLOW_ISSUERS (zerossl): cannot register …: refused")
        return account  # type: ignore[no-any-return]

    clients = AcmeClients(None, ISSUER, register=register)
    assert clients.account_url is None
    with pytest.raises(AcmeProblemError) as caught:
        _ = clients.account
    assert caught.value.code is ErrorCode.ACME_TEMPORARY and caught.value.unreachable

    with pytest.raises(AcmeProblemError) as caught:
        await clients.ready()
    assert caught.value.unreachable
    assert caught.value.message.startswith("no ACME account at zerossl yet: CERTFLOW_ISSUERS")
    clock[0] += 30
    with pytest.raises(AcmeProblemError):
        await clients.ready()  # within the minute: not asked again
    assert tries == [1000.0]

    clock[0] += 31
    await clients.ready()
    assert tries == [1000.0, 1061.0]
    assert clients.account_url == "https://acme.test/acct/7"
    await clients.ready()  # registered: nothing asked
    assert len(tries) == 2
