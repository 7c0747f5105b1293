"""An order whose authorization the CA reused, already valid: Boulder lists only
the challenge that validated it (ra.go, the authorization reuse of NewOrder), of
whatever type, and the order is ready. certflow takes that challenge instead of
refusing the order as ACME_REJECTED, and neither self-checks nor accepts it.

Red with the valid branch of ``choose_challenge`` taken out (checked once: None,
which ``_open_order`` raises as ACME_REJECTED, a terminal error for an order
that was ready)."""

from __future__ import annotations

from acme import messages

from activities.obtain import validation_of
from certflow.acme.new_order import choose_challenge
from certflow.activity_payloads import OrderAndValidateInput, PlaceOrderInput, PlacedOrder
from certflow.hostnames import as_hostname
from certflow.models import OrderKind, ValidationMethod


def _authz(status: str, *challenges: tuple[str, str]) -> messages.Authorization:
    authz: messages.Authorization = messages.Authorization.from_json(
        {
            "identifier": {"type": "dns", "value": "shop.test"},
            "status": status,
            "challenges": [
                {"type": kind, "url": f"https://ca.test/chall/{kind}", "status": state, "token": "t" * 43}
                for kind, state in challenges
            ],
        }
    )
    return authz


def test_a_pending_authorization_answers_the_first_wanted_method() -> None:
    authz = _authz("pending", ("http-01", "pending"), ("dns-01", "pending"))
    chosen = choose_challenge(authz, [ValidationMethod.DNS_01, ValidationMethod.HTTP_01])
    assert chosen is not None and chosen[1] is ValidationMethod.DNS_01
    assert choose_challenge(_authz("pending", ("http-01", "pending")), [ValidationMethod.DNS_01]) is None


def test_a_reused_valid_authorization_is_taken_whatever_its_challenge() -> None:
    """Validated by http-01 earlier, asked for dns-01 now: the order is ready."""
    authz = _authz("valid", ("http-01", "valid"))
    chosen = choose_challenge(authz, [ValidationMethod.DNS_01])
    assert chosen is not None
    challenge, method = chosen
    assert method is ValidationMethod.HTTP_01 and challenge.uri == "https://ca.test/chall/http-01"


def test_a_reused_authorization_is_neither_self_checked_nor_accepted() -> None:
    order = PlaceOrderInput(
        certificate_id="c", hostname=as_hostname("shop.test"), kind=OrderKind.NEW, methods=[ValidationMethod.DNS_01]
    )
    placed = PlacedOrder(
        order_url="https://ca.test/order/1",
        challenge_url="https://ca.test/chall/http-01",
        token="t",
        key_authorization="t.k",
        method=ValidationMethod.HTTP_01,
        authorized=True,
    )
    validation = validation_of(OrderAndValidateInput(order=order, within_seconds=8), placed)
    assert validation is not None
    assert validation.self_check is False and validation.wait.accept_first is False
    dns01 = placed.model_copy(update={"method": ValidationMethod.DNS_01})
    again = validation_of(OrderAndValidateInput(order=order, within_seconds=8), dns01)
    assert again is not None and again.wait.accept_first is False  # no TXT wait: the order is ready
