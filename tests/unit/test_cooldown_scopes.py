"""Which cooldowns hold back which orders (docs/rate-limits.md): a renewal is exempt from new
orders per account and certificates per registered domain; an ARI renewal from
every limit but the overall request rate; a first order from none."""

from __future__ import annotations

import pytest

from certflow.acme.exchange import _scope_key
from certflow.store.cooldowns import holds
from certflow.models import LimitScope, OrderKind

LIMITS = [
    "NewOrdersPerAccount",
    "CertificatesPerDomain",
    "CertificatesPerFQDNSet",
    "FailedAuthorizationsPerDomainPerAccount",
    "FailedAuthorizationsForPausingPerDomainPerAccount",
    "NewRegistrationsPerIPAddress",
    "OverallRequests",
    "Unknown",
]


@pytest.mark.parametrize("limit", LIMITS)
def test_a_first_order_is_held_by_every_limit(limit: str) -> None:
    assert holds(limit, OrderKind.NEW)


@pytest.mark.parametrize("limit", LIMITS)
def test_a_renewal_is_exempt_from_the_account_and_registered_domain_order_limits(limit: str) -> None:
    exempt = limit in ("NewOrdersPerAccount", "CertificatesPerDomain")
    assert holds(limit, OrderKind.RENEWAL) is not exempt


@pytest.mark.parametrize("limit", LIMITS)
def test_an_ari_renewal_is_held_only_by_the_overall_request_rate(limit: str) -> None:
    assert holds(limit, OrderKind.ARI_RENEWAL) is (limit == "OverallRequests")


@pytest.mark.parametrize(
    ("scope", "key"),
    [
        (LimitScope.ACCOUNT, ""),
        (LimitScope.REGISTERED_DOMAIN, "example.co.uk"),
        (LimitScope.HOSTNAME, "a.b.example.co.uk"),
    ],
)
def test_scope_keys(scope: LimitScope, key: str) -> None:
    assert _scope_key(scope, "a.b.example.co.uk") == key
