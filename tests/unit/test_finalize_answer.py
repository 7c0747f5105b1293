"""What the CA's answer to a finalize tells ``OrderFinalization`` (RFC 8555 §7.4):
an order already valid carries its certificate URL, and no poll is needed.

A fake ``ClientNetwork`` stands in for the CA (pure logic). Shown to fail once:
with the answer dropped (``_begin_finalize`` returning None), the first test
went red.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from acme import messages
from cryptography.hazmat.primitives.asymmetric import ec

from certflow.acme.exchange import IssuerExchange
from certflow.acme.finalize import OrderFinalization, issued_url
from certflow.crypto import make_csr

FINALIZE_URL = "https://ca.test/order/1/finalize"
CERT_URL = "https://ca.test/cert/1"


class _Response:
    def __init__(self, body: Any) -> None:
        self._body = body

    def json(self) -> Any:
        return self._body


class _Network:
    def __init__(self, answer: dict[str, Any] | messages.Error) -> None:
        self.answer = answer
        self.posted: list[str] = []

    def post(self, url: str, obj: Any, new_nonce_url: str | None = None) -> _Response:
        self.posted.append(url)
        if isinstance(self.answer, messages.Error):
            raise self.answer
        return _Response(self.answer)


def _finalize(network: _Network) -> dict[str, Any] | None:
    ca = object.__new__(IssuerExchange)  # the CA's exchange, with no account behind it
    ca.clients = SimpleNamespace(new_nonce_url="https://ca.test/nonce")  # type: ignore[assignment]
    finalization = OrderFinalization(ca)
    csr = make_csr(ec.generate_private_key(ec.SECP256R1()), "shop.example.test")
    return finalization._begin_finalize(SimpleNamespace(net=network), FINALIZE_URL, csr)  # type: ignore[arg-type]


def test_a_ca_that_issues_at_once_needs_no_poll() -> None:
    # acme2certifier, and Boulder without AsyncFinalize: the answer is the valid order.
    network = _Network({"status": "valid", "certificate": CERT_URL, "finalize": FINALIZE_URL})
    assert issued_url(_finalize(network)) == CERT_URL
    assert network.posted == [FINALIZE_URL]


def test_an_order_still_processing_is_polled() -> None:
    # Pebble, and Boulder with AsyncFinalize.
    assert issued_url(_finalize(_Network({"status": "processing", "finalize": FINALIZE_URL}))) is None


def test_a_finalize_refused_as_not_ready_is_a_retry_that_polls() -> None:
    refused = messages.Error.from_json(
        {"type": "urn:ietf:params:acme:error:orderNotReady", "detail": "processing"}
    )
    assert _finalize(_Network(refused)) is None


def test_other_refusals_are_raised() -> None:
    refused = messages.Error.from_json({"type": "urn:ietf:params:acme:error:badCSR", "detail": "x"})
    with pytest.raises(messages.Error):
        _finalize(_Network(refused))


def test_a_valid_order_without_a_certificate_url_is_not_issued() -> None:
    assert issued_url({"status": "valid"}) is None
    assert issued_url(None) is None
