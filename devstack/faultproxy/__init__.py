"""A fault-injecting HTTPS reverse proxy in front of a real Pebble, for tests.

Real CAs do not answer 429/503/500 or drop connections on demand, so tests put
this proxy between the ACME client and Pebble and tell it, per ACME endpoint,
which faults to inject::

    proxy = start_fault_proxy(pebble, pebble_workdir)
    proxy.inject(Endpoint.NEW_ORDER, Fault.rate_limited("30"))   # next new-order only
    proxy.inject_always(Endpoint.NONCE, Fault.unavailable())       # until cleared
    ... client.directory_url = proxy.directory_url ...
    assert proxy.count(Endpoint.NEW_ORDER) == 2
    proxy.stop()

How it stays transparent: Pebble builds every URL it hands out (directory,
``Location``, ``Link``, order/authz/challenge/cert URLs) from the request's
``Host`` header and checks each JWS ``url`` against it. The proxy therefore
forwards the client's ``Host`` (``127.0.0.1:<proxy port>``) unchanged while
connecting to Pebble's real port, so nothing needs rewriting and a client that
starts at :attr:`FaultProxy.directory_url` stays on the proxy. It serves TLS
with Pebble's own leaf certificate (valid for 127.0.0.1), so ``pebble.ca_bundle``
trusts the proxy as well.

Injected faults are answered by the proxy without forwarding anything (a
faulted new-order creates nothing at the CA). Error responses to POSTs carry a
fresh ``Replay-Nonce`` fetched from Pebble, as RFC 8555 section 6.5 asks of a
real server. Everything runs in background threads of the calling process and
does not touch any event loop; :meth:`FaultProxy.stop` ends them all.

ACME Renewal Information (RFC 9773), opt in: Pebble does not advertise
``renewalInfo``, so the proxy can play that part of the CA::

    proxy.serve_renewal_info(window_start, window_end, retry_after="3600")
    proxy.inject(Endpoint.RENEWAL_INFO, Fault.unavailable(retry_after="1"))  # optional
    ... a client reading proxy.directory_url now finds "renewalInfo" ...
    assert proxy.renewal_info_requests() == [cert_id]

From then on the proxied directory carries ``"renewalInfo":
proxy.renewal_info_url`` and ``GET <renewal_info_url>/<certID>`` is answered by
the proxy itself with that window and ``Retry-After``. Faults injected for
:attr:`Endpoint.RENEWAL_INFO` come first, as for any endpoint. Without the
opt-in nothing changes: the directory is relayed as Pebble sent it.

Request hooks, opt in: a test that must act at an exact point of an exchange
(e.g. kill the client right after the CA created an order) registers a
callback per endpoint::

    def created(request: Forwarded) -> None:
        if request.status == 201: ...           # Pebble's answer, not yet relayed
    remove = proxy.on_forwarded(Endpoint.NEW_ORDER, created)
    ...
    remove()

:meth:`FaultProxy.before_forwarding` registers the same kind of callback to
run *before* a request reaches Pebble (e.g. change what Pebble's validation
will see the moment a challenge is accepted).

The callback runs in the proxy's handler thread after Pebble answered a
forwarded request and before that answer is relayed to the client, so a
callback that blocks holds the answer back (and one that kills the client
means the client never sees it). Injected faults and the proxy's own ARI
answers are not forwarded, so they do not call hooks. An exception in a
callback is logged and otherwise ignored. Without hooks nothing changes.

Let's Encrypt's rate limits, opt in: the proxy decides, before forwarding a
new-order, whether Boulder's buckets allow it, and answers a refusal itself::

    proxy.emulate_limits(LimitsConfig(per_domain=Bucket(5, period=20.0)))  # 5 per "week"
    proxy.emulate_limits(LimitsConfig(new_orders=Bucket(3, period=10.0)))  # the account alone
    ... [d for d in proxy.limit_decisions() if not d.allowed] ...
    proxy.emulate_limits(None)                                             # off again

The buckets are Boulder's (letsencrypt/boulder ``ratelimits``): GCRA token
buckets holding ``capacity`` tokens, one coming back every ``period /
capacity`` seconds (time scaled: a "week" can be seconds), keyed as Let's
Encrypt keys them: NewOrdersPerAccount per account (the JWS ``kid``),
CertificatesPerDomain per registered domain (public suffix + 1 label,
``certflow.hostnames.registered_domain``), CertificatesPerFQDNSet per exact
identifier set, FailedAuthorizationsPerDomainPerAccount per identifier per
account. A new-order is checked against all of them at once and refused by the
strictest (``wfe2/wfe.go`` checkNewOrderLimits): HTTP 429,
``application/problem+json`` ``{"type": "urn:ietf:params:acme:error:rateLimited",
"detail": <Boulder's text, ending ": see
https://letsencrypt.org/docs/rate-limits/#<anchor>">, "status": 429}``,
``Retry-After`` = seconds until that bucket has a token plus up to 3 % jitter,
rounded up (Boulder rounds to the nearest second), Boulder's ``Link:
<https://letsencrypt.org/docs/rate-limits>;rel="help"`` and a fresh
``Replay-Nonce``; nothing reaches Pebble. When tokens are spent follows Boulder:
NewOrdersPerAccount when the order is created (taken at the decision, refunded
unless Pebble answered 201); the certificate limits are only checked at
new-order and spent when the certificate is issued (``ra/ra.go``
countCertificateIssued; the proxy sees the order turn ``valid`` or the
certificate downloaded), so orders placed before earlier ones are issued all
pass, as at Let's Encrypt; ``LimitsConfig(certificates_spent_at=SpendAt.ORDER)``
spends them at the 201 instead, for tests that need a burst to find the bucket
exactly. Failed authorizations are spent when the proxy sees an authorization
(or its challenge, or its order) turn ``invalid``. Exemptions as Let's Encrypt
applies them: an order for an identifier set the proxy saw issued is a renewal,
exempt from NewOrdersPerAccount and CertificatesPerDomain (and at issuance it
spends no CertificatesPerDomain); an order whose ``replaces`` names a
certificate the proxy saw downloaded (RFC 9773 certID, :func:`ari_cert_id`)
while the proxy serves an ARI window containing now is exempt from all limits.
Every decision is kept (:meth:`FaultProxy.limit_decisions`,
:meth:`~FaultProxy.limit_spends`, :meth:`~FaultProxy.limit_counts`). Injected
faults come first; without the opt-in nothing changes.
"""

from __future__ import annotations

from devstack.faultproxy.faults import (  # noqa: F401
    Arriving,
    ArrivingCallback,
    Endpoint,
    Fault,
    Forwarded,
    ForwardedCallback,
    RENEWAL_INFO_PATH,
    classify_path,
)
from devstack.faultproxy.limits import (  # noqa: F401
    Bucket,
    CERTIFICATES_PER_DOMAIN,
    CERTIFICATES_PER_FQDN_SET,
    FAILED_AUTHORIZATIONS,
    LimitCheck,
    LimitDecision,
    LimitSpend,
    LimitsConfig,
    MALFORMED,
    NEW_ORDERS_PER_ACCOUNT,
    OrderKind,
    RATE_LIMITED,
    RATE_LIMITS_DOCS,
    RATE_LIMITS_HELP_LINK,
    SpendAt,
    ari_cert_id,
    go_duration,
)
from devstack.faultproxy.proxy import (  # noqa: F401
    FaultProxy,
    start_fault_proxy,
)

__all__ = [
    "Arriving",
    "CERTIFICATES_PER_DOMAIN",
    "NEW_ORDERS_PER_ACCOUNT",
    "Bucket",
    "Endpoint",
    "Fault",
    "FaultProxy",
    "Forwarded",
    "LimitCheck",
    "LimitDecision",
    "LimitSpend",
    "LimitsConfig",
    "OrderKind",
    "SpendAt",
    "ari_cert_id",
    "classify_path",
    "go_duration",
    "start_fault_proxy",
]
