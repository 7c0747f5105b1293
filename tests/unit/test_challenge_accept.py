"""What the CA's answer to a challenge accept tells ``OrderValidation._accept``.

A fake ``ClientNetwork`` stands in for the CA (pure logic: no exchange, no
activity). Shown to fail once: without the ``conflict`` branch, the accept
answered with Boulder's 409 raised (the challenge still reads pending).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from acme import messages

from certflow.acme.exchange import IssuerExchange
from certflow.acme.validation import OrderValidation
from certflow.models import AcmeStatus

CHALLENGE_URL = "https://ca.test/chall/1"
# Boulder's words (sa.go SetAuthzProcessing, rendered by web/probs.go as 409 conflict).
ALREADY_VALIDATING = messages.Error.from_json(
    {
        "type": "urn:ietf:params:acme:error:conflict",
        "detail": "Error updating challenge :: failed to mark authz as processing: Authorization"
        " is already being validated. This may indicate your client attempted the same"
        " challenge multiple times, possibly due to a client bug.",
        "status": 409,
    }
)


class _Response:
    def __init__(self, body: Any) -> None:
        self._body = body
        self.headers: dict[str, str] = {}

    def json(self) -> Any:
        return self._body


class _Network:
    """Answers the accept (a POST with a body) with ``accept``, a POST-as-GET with
    the challenge in ``status``."""

    def __init__(self, accept: messages.Error | dict[str, Any], status: str) -> None:
        self.accept = accept
        self.status = status
        self.reads = 0

    def post(self, url: str, obj: Any, new_nonce_url: str | None = None) -> _Response:
        if obj is None:
            self.reads += 1
            return _Response({"status": self.status, "url": url})
        if isinstance(self.accept, messages.Error):
            raise self.accept
        return _Response(self.accept)


def _accept(network: _Network) -> str | None:
    ca = object.__new__(IssuerExchange)  # the CA's exchange, with no account behind it
    ca.clients = SimpleNamespace(new_nonce_url="https://ca.test/nonce")  # type: ignore[assignment]
    validation = OrderValidation(ca)
    return validation._accept(SimpleNamespace(net=network), CHALLENGE_URL)  # type: ignore[arg-type]


def test_the_answered_status_is_returned() -> None:
    assert _accept(_Network({"status": "pending", "type": "http-01"}, "pending")) == "pending"


def test_a_conflict_means_the_ca_is_already_validating() -> None:
    network = _Network(ALREADY_VALIDATING, AcmeStatus.PENDING)
    assert _accept(network) == AcmeStatus.PROCESSING
    assert network.reads == 0  # the answer says it all: nothing read


def test_a_refused_accept_on_a_challenge_done_is_its_status() -> None:
    # Pebble: malformed to a second accept; the challenge tells.
    refused = messages.Error.from_json({"type": "urn:ietf:params:acme:error:malformed", "detail": "x"})
    assert _accept(_Network(refused, AcmeStatus.VALID)) == AcmeStatus.VALID


def test_a_refused_accept_on_a_pending_challenge_is_raised() -> None:
    refused = messages.Error.from_json({"type": "urn:ietf:params:acme:error:malformed", "detail": "y"})
    with pytest.raises(messages.Error):
        _accept(_Network(refused, AcmeStatus.PENDING))
