"""What the CA's problem documents mean (certflow/acme/problems.py, its two tables
in rate_limits.py and refusals.py), on real Let's Encrypt (Boulder) answers.

Every detail below is Boulder's format string filled in as Boulder fills it; the
comment above each names the letsencrypt/boulder file it comes from (commit
2d00c8e2, 2026-08). Periods are Go durations as Boulder prints them
(``3h0m0s``), timestamps its ``2006-01-02 15:04:05 MST`` layout.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest
from acme import messages

from certflow.acme.network import HttpStatusError, classify_acme_failure
from certflow.acme.problems import challenge_failure, problem_error
from certflow.acme.rate_limits import (
    LIMIT_ANCHORS,
    RateLimit,
    is_rate_limited,
    limit_anchor,
    rate_limit_for,
    unpause_url,
)
from certflow.acme.refusals import Effect, ReplacesRefusal, replaces_refusal, refusal_for
from certflow.models import LimitScope
from certflow.errors import USER_MESSAGES, ErrorCode
from certflow.hostnames import registered_domain

E = ErrorCode
ERR = "urn:ietf:params:acme:error:"
DOCS = "https://letsencrypt.org/docs/rate-limits/"
AT = "retry after 2026-08-07 15:04:05 UTC"


def _boulder(typ: str, detail: str, status: int, retry_after: str | None = None,
             subproblems: list[dict[str, Any]] | None = None) -> messages.Error:
    """A problem document as Boulder's wfe2 sends it (web/send_error.go), parsed by acme."""
    body: dict[str, Any] = {"type": ERR + typ, "detail": detail, "status": status}
    if subproblems:
        body["subproblems"] = subproblems
    err: messages.Error = messages.Error.from_json(body)
    err.http_status = status
    err.retry_after = retry_after
    return err


# ------------------------------------------------------------------ table 1: scopes

# ratelimits/limiter.go Decision.Result: the message; errors/errors.go: ": see <link>".
NEW_REGISTRATIONS_PER_IP = (
    f"too many new registrations (10) from this IP address in the last 3h0m0s, {AT}: "
    f"see {DOCS}#new-registrations-per-ip-address"
)
NEW_REGISTRATIONS_PER_IPV6_RANGE = (
    f"too many new registrations (500) from this /48 subnet of IPv6 addresses in the last"
    f" 3h0m0s, {AT}: see {DOCS}#new-registrations-per-ipv6-range"
)
NEW_ORDERS_PER_ACCOUNT = (
    f"too many new orders (300) from this account in the last 3h0m0s, {AT}: "
    f"see {DOCS}#new-orders-per-account"
)
CERTIFICATES_PER_DOMAIN = (
    f'too many certificates (50) already issued for "example.com" in the last 168h0m0s, {AT}: '
    f"see {DOCS}#new-certificates-per-registered-domain"
)
CERTIFICATES_PER_FQDN_SET = (
    "too many certificates (5) already issued for this exact set of identifiers in the last"
    f" 168h0m0s, {AT}: see {DOCS}#new-certificates-per-exact-set-of-identifiers"
)
FAILED_AUTHORIZATIONS = (
    f'too many failed authorizations (5) for "shop.example.com" in the last 1h0m0s, {AT}: '
    f"see {DOCS}#authorization-failures-per-identifier-per-account"
)
# wfe2/wfe.go NewOrder (probs.Paused: rateLimited, 429, no Retry-After); the link is
# wfe.unpauseURL + unpause.GetForm ("/sfe/v1/unpause", unpause/unpause.go) + "?jwt=".
UNPAUSE = (
    "https://portal.letsencrypt.org/sfe/v1/unpause"
    "?jwt=eyJhbGciOiJIUzI1NiJ9.eyJhdWQiOiJTRkUgVW5wYXVzZSJ9.c2ln"
)
PAUSED = (
    "Your account is temporarily prevented from requesting certificates for shop.example.com"
    f" and possibly others. Please visit: {UNPAUSE}"
)


@pytest.mark.parametrize(
    ("detail", "scope", "anchor", "name"),
    [
        (NEW_REGISTRATIONS_PER_IP, LimitScope.ACCOUNT, "new-registrations-per-ip-address",
         "NewRegistrationsPerIPAddress"),
        (NEW_REGISTRATIONS_PER_IPV6_RANGE, LimitScope.ACCOUNT, "new-registrations-per-ipv6-range",
         "NewRegistrationsPerIPv6Range"),
        (NEW_ORDERS_PER_ACCOUNT, LimitScope.ACCOUNT, "new-orders-per-account", "NewOrdersPerAccount"),
        (CERTIFICATES_PER_DOMAIN, LimitScope.REGISTERED_DOMAIN,
         "new-certificates-per-registered-domain", "CertificatesPerDomain"),
        (CERTIFICATES_PER_FQDN_SET, LimitScope.HOSTNAME,
         "new-certificates-per-exact-set-of-identifiers", "CertificatesPerFQDNSet"),
        (FAILED_AUTHORIZATIONS, LimitScope.HOSTNAME,
         "authorization-failures-per-identifier-per-account",
         "FailedAuthorizationsPerDomainPerAccount"),
    ],
)
def test_every_limit_by_its_anchor(detail: str, scope: LimitScope, anchor: str, name: str) -> None:
    assert rate_limit_for(detail, 429, ERR + "rateLimited") == RateLimit(scope, anchor, name)
    err = classify_acme_failure(_boulder("rateLimited", detail, 429, "3600"))
    assert err.code is E.ACME_RATE_LIMITED and err.retry_after_seconds == 3600
    assert (err.limit_scope, err.limit_anchor, err.limit_name) == (str(scope), anchor, name)
    assert not err.paused and err.unpause_url is None
    assert err.message.startswith("the CA is rate-limiting") and detail in err.message
    details = err.details()
    assert details["limit_scope"] == str(scope) and details["limit_anchor"] == anchor


@pytest.mark.parametrize(
    ("anchor", "scope"),
    [
        # the anchors docs/lifecycle.md, "Statuses and errors" names, including those Boulder linked before #8291/#8596
        # (errors/errors.go history) and the overall-requests 503
        ("new-orders-per-account", LimitScope.ACCOUNT),
        ("new-registrations-per-ip-address", LimitScope.ACCOUNT),
        ("new-registrations-per-ipv6-range", LimitScope.ACCOUNT),
        ("overall-requests", LimitScope.ACCOUNT),
        ("overall-requests-limit", LimitScope.ACCOUNT),
        ("limit-override-requests-per-ip-address", LimitScope.ACCOUNT),
        ("new-certificates-per-registered-domain", LimitScope.REGISTERED_DOMAIN),
        ("new-certificates-per-exact-set-of-identifiers", LimitScope.HOSTNAME),
        ("new-certificates-per-exact-set-of-hostnames", LimitScope.HOSTNAME),
        ("authorization-failures-per-hostname-per-account", LimitScope.HOSTNAME),
        ("authorization-failures-per-identifier-per-account", LimitScope.HOSTNAME),
        ("consecutive-authorization-failures-per-hostname-per-account", LimitScope.HOSTNAME),
        ("consecutive-authorization-failures-per-identifier-per-account", LimitScope.HOSTNAME),
    ],
)
def test_anchor_table(anchor: str, scope: LimitScope) -> None:
    assert LIMIT_ANCHORS[anchor][0] is scope
    limit = rate_limit_for(f"something new: see {DOCS}#{anchor}")
    assert (limit.scope, limit.anchor) == (scope, anchor)
    assert limit.paused is anchor.startswith("consecutive-")


def test_anchor_is_read_case_insensitively_and_only_from_the_rate_limits_page() -> None:
    assert limit_anchor(f"x: see {DOCS}#New-Orders-Per-Account") == "new-orders-per-account"
    assert limit_anchor("see https://letsencrypt.org/docs/duplicate-certificate-limit/") is None
    assert limit_anchor("see https://example.com/#new-orders-per-account") is None


@pytest.mark.parametrize(
    ("detail", "scope", "name"),
    [
        # ratelimits/limiter.go wording without the link (a proxy trimmed it, or an
        # anchor renamed again)
        ('too many certificates (50) already issued for "example.com" in the last 168h0m0s',
         LimitScope.REGISTERED_DOMAIN, "CertificatesPerDomain"),
        ("too many new orders (300) from this account in the last 3h0m0s", LimitScope.ACCOUNT,
         "NewOrdersPerAccount"),
        ('too many failed authorizations (5) for "shop.example.com" in the last 1h0m0s',
         LimitScope.HOSTNAME, "FailedAuthorizationsPerDomainPerAccount"),
        ("too many certificates (5) already issued for this exact set of identifiers in the"
         " last 168h0m0s", LimitScope.HOSTNAME, "CertificatesPerFQDNSet"),
        ("too many certificates with the same set of identifiers", LimitScope.HOSTNAME,
         "CertificatesPerFQDNSet"),
        ("too many new registrations (10) from this IP address in the last 3h0m0s",
         LimitScope.ACCOUNT, "NewRegistrationsPerIPAddress"),
        # older Boulder (ra/ra.go before 2021): the legacy pages, no anchor
        ("Error creating new order :: too many certificates already issued for exact set of"
         " domains: shop.example.com: see https://letsencrypt.org/docs/duplicate-certificate-limit/",
         LimitScope.HOSTNAME, "CertificatesPerFQDNSet"),
        ("Error creating new order :: too many certificates already issued for: example.com:"
         " see https://letsencrypt.org/docs/rate-limits/", LimitScope.REGISTERED_DOMAIN,
         "CertificatesPerDomain"),
        # an unknown anchor still falls back on the wording
        (f"too many new orders (300) from this account in the last 3h0m0s: see {DOCS}#renamed",
         LimitScope.ACCOUNT, "NewOrdersPerAccount"),
    ],
)
def test_fallback_on_boulders_wording(detail: str, scope: LimitScope, name: str) -> None:
    limit = rate_limit_for(detail, 429)
    assert (limit.scope, limit.name, limit.paused) == (scope, name, False)


@pytest.mark.parametrize(
    "detail",
    [
        f"too many widgets: see {DOCS}#new-widgets-per-galaxy",
        f"too many currently pending authorizations: see {DOCS}",
        "slow down",
        "",
    ],
)
def test_unknown_limit_is_the_account(detail: str) -> None:
    limit = rate_limit_for(detail, 429)
    assert limit.scope is LimitScope.ACCOUNT and limit.name == "Unknown"
    err = classify_acme_failure(_boulder("rateLimited", detail or "x", 429))
    assert err.limit_scope == "account"


def test_bare_429_is_the_account() -> None:
    err = classify_acme_failure(HttpStatusError(429, "60", "Too Many Requests"))
    assert err.code is E.ACME_RATE_LIMITED and err.limit_scope == "account"


def test_503_with_retry_after_is_the_overall_request_limit() -> None:
    # The load balancers answer it (rate-limits page, "Overall Requests Limit"):
    # no problem document, a Retry-After.
    err = classify_acme_failure(HttpStatusError(503, "5", "<html>503 Service Unavailable</html>"))
    assert err.code is E.ACME_RATE_LIMITED and err.retry_after_seconds == 5
    assert (err.limit_scope, err.limit_name) == ("account", "OverallRequests")
    assert rate_limit_for("busy", 503) == RateLimit(LimitScope.ACCOUNT, None, "OverallRequests")
    # without Retry-After it is no rate limit at all
    assert classify_acme_failure(HttpStatusError(503, None, "busy")).code is E.ACME_TEMPORARY
    assert not is_rate_limited("", 503, None) and is_rate_limited("", 503, 0.0)


def test_paused_identifier_with_its_unpause_url() -> None:
    assert unpause_url(PAUSED) == UNPAUSE
    limit = rate_limit_for(PAUSED, 429, ERR + "rateLimited")
    assert limit == RateLimit(
        LimitScope.HOSTNAME, None, "FailedAuthorizationsForPausingPerDomainPerAccount",
        paused=True, unpause_url=UNPAUSE,
    )
    err = classify_acme_failure(_boulder("rateLimited", PAUSED, 429))
    assert err.code is E.ACME_RATE_LIMITED and err.retry_after_seconds is None
    assert err.paused and err.unpause_url == UNPAUSE and err.limit_scope == "hostname"
    assert err.message == (
        f"paused by the CA (too many consecutive failed authorizations); unpause at {UNPAUSE}"
    )
    assert err.details()["paused"] is True and err.details()["unpause_url"] == UNPAUSE


def test_paused_in_the_integration_tests_form_and_without_a_link() -> None:
    # test/integration/pausing_test.go asserts the text and this link (test config's URL)
    local = "https://boulder.service.consul:4003/sfe/v1/unpause?jwt=abc.def.ghi"
    detail = (
        "Your account is temporarily prevented from requesting certificates for a.example,"
        f" b.example and possibly others. Please visit: {local}"
    )
    assert rate_limit_for(detail).unpause_url == local
    bare = rate_limit_for("identifier paused after too many consecutive authorization failures")
    assert bare.paused and bare.scope is LimitScope.HOSTNAME and bare.unpause_url is None
    assert "consecutive authorization failures" in problem_error(
        ERR + "rateLimited", "identifier is paused after consecutive authorization failures",
        http_status=429,
    ).message


# ------------------------------------------------------------ registered domains


@pytest.mark.parametrize(
    ("hostname", "expected"),
    [
        ("a.b.example.co.uk", "example.co.uk"),
        ("shop.example.com", "example.com"),
        ("example.com", "example.com"),
        # Boulder reads the private section too (publicsuffix.Domain → DefaultFindOptions)
        ("x.github.io", "x.github.io"),
        ("a.x.github.io", "x.github.io"),
        # a public suffix itself, or no registrable part: the name as it is
        ("co.uk", "co.uk"),
        ("github.io", "github.io"),
        # an unlisted TLD is a suffix of its own (DefaultRule "*")
        ("a.b.example.internaltld", "example.internaltld"),
        # IDN A-labels
        ("shop.xn--fiqs8s", "shop.xn--fiqs8s"),
        ("Shop.Example.COM.", "example.com"),
    ],
)
def test_registered_domain(hostname: str, expected: str) -> None:
    assert registered_domain(hostname) == expected


# ------------------------------------------------------------ table 2: refusals

# policy/pa.go (errPolicyForbidden, combineSubErrors) via ra.NewOrder, rendered by
# web/probs.go as "<msg> :: <detail>" with wfe2's msg "Error creating new order".
POLICY_FORBIDDEN = (
    'Error creating new order :: Cannot issue for "shop.example.com": The ACME server refuses'
    " to issue a certificate for this domain name, because it is forbidden by policy"
)
# wfe2/wfe.go NewOrder (probs.UnsupportedIdentifier)
UNSUPPORTED = 'NewOrder request included unsupported identifier: type "email", value "a@b.c"'
# ra/ra.go (berrors.BadCSRError) via "Error finalizing order"
BAD_CSR = "Error finalizing order :: unable to parse CSR: asn1: syntax error"
# wfe2/wfe.go NewOrder (probs.InvalidProfile(err.Error()), validateCertificateProfileName)
INVALID_PROFILE = 'profile name "tlsclient" not recognized'
# ra/ra.go checkAuthorizationsCAA ("rechecking caa: %s") of va/caa.go's problem
# (DoCAA's "While processing CAA for %s: " + checkCAA's "CAA record for %s prevents
# issuance"), as wfe2/wfe.go FinalizeOrder renders it ("Error finalizing order"); the
# same document as an invalid order's "error" field
CAA_ORDER_ERROR = {
    "type": ERR + "caa",
    "detail": "Error finalizing order :: rechecking caa: While processing CAA for"
    " shop.example.com: CAA record for shop.example.com prevents issuance",
    "status": 403,
}
# va/va.go detailedError: ipError "%s: %s" around url.Error "Fetching %s: %s" around
# ECONNREFUSED → probs.Connection("Connection refused")
CONNECTION_REFUSED = {
    "type": ERR + "connection",
    "detail": "127.0.0.9: Fetching http://shop.example.com/.well-known/acme-challenge/"
    "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0: Connection refused",
    "status": 400,
}
# va/http.go: UnauthorizedError("Invalid response from %s: %d") in an ipError
INVALID_RESPONSE_404 = {
    "type": ERR + "unauthorized",
    "detail": "203.0.113.7: Invalid response from http://shop.example.com/.well-known/"
    "acme-challenge/LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0: 404",
    "status": 403,
}
# va/dns.go getAddrs ("%s; %s" of the A and AAAA errors), bdns/problem.go
# ("DNS problem: %s looking up %s for %s%s", rcodeExplanations[NXDOMAIN])
NXDOMAIN = {
    "type": ERR + "dns",
    "detail": "DNS problem: NXDOMAIN looking up A for shop.example.com - check that a DNS"
    " record exists for this domain; DNS problem: NXDOMAIN looking up AAAA for"
    " shop.example.com - check that a DNS record exists for this domain",
    "status": 400,
}
# va/va.go detailedError: a dial timeout
TIMEOUT = {
    "type": ERR + "connection",
    "detail": "203.0.113.7: Fetching http://shop.example.com/.well-known/acme-challenge/x:"
    " Timeout during connect (likely firewall problem)",
    "status": 400,
}
# va/caa.go checkCAA during validation: CAAError, prefixed in DoCAA
CAA_CHALLENGE = {
    "type": ERR + "caa",
    "detail": "While processing CAA for shop.example.com: CAA record for example.com"
    " prevents issuance",
    "status": 403,
}
# va/va.go: a remote TLS alert (HTTP-01 redirected to https) → probs.TLS
TLS_ALERT = {
    "type": ERR + "tls",
    "detail": "203.0.113.7: remote error: tls: handshake failure",
    "status": 400,
}
# va/http.go: the key authorization did not match (unauthorized)
WRONG_KEY_AUTH = {
    "type": ERR + "unauthorized",
    "detail": 'The key authorization file from the server did not match this challenge.'
    ' Expected "tok.thumb" (got "nope")',
    "status": 403,
}
# policy/pa.go via the authorization (a challenge error can carry it too)
REJECTED_CHALLENGE = {
    "type": ERR + "rejectedIdentifier",
    "detail": 'Cannot issue for "shop.example.com": The ACME server refuses to issue a'
    " certificate for this domain name, because it is forbidden by policy",
    "status": 400,
}


@pytest.mark.parametrize(
    ("typ", "detail", "status"),
    [
        ("rejectedIdentifier", POLICY_FORBIDDEN, 400),
        ("unsupportedIdentifier", UNSUPPORTED, 400),
        ("badCSR", BAD_CSR, 400),
        ("invalidProfile", INVALID_PROFILE, 400),
    ],
)
def test_refused_name_or_request_is_terminal(typ: str, detail: str, status: int) -> None:
    err = classify_acme_failure(_boulder(typ, detail, status))
    assert err.code is E.ACME_REJECTED and err.non_retryable
    assert err.message == f"the CA refused to issue for this hostname: {detail}"
    assert refusal_for(ERR + typ).effect is Effect.TERMINAL


def test_rejected_identifier_with_subproblems() -> None:
    # policy/pa.go combineSubErrors with two bad names
    err = classify_acme_failure(_boulder(
        "rejectedIdentifier",
        'Error creating new order :: Cannot issue for "a.example": Domain name contains an'
        " invalid label in a reserved format (R-LDH: '??--') (and 1 more problems. Refer to"
        " sub-problems for more information.)",
        400,
        subproblems=[
            {"type": ERR + "rejectedIdentifier", "detail": "Error creating new order :: x",
             "identifier": {"type": "dns", "value": "a.example"}},
            {"type": ERR + "malformed", "detail": "Error creating new order :: y",
             "identifier": {"type": "dns", "value": "b.example"}},
        ],
    ))
    assert err.code is E.ACME_REJECTED and len(err.subproblems) == 2


def test_compound_answer_is_decided_by_its_subproblems() -> None:
    subproblems = [{"type": ERR + "malformed"}, {"type": ERR + "caa"}]
    assert refusal_for(ERR + "compound", subproblems).code is E.ACME_CAA
    subproblems.append({"type": ERR + "rejectedIdentifier"})
    assert refusal_for(ERR + "compound", subproblems).code is E.ACME_REJECTED


def test_caa_from_the_ca_is_a_failed_authorization_with_its_detail() -> None:
    """The CA refused on CAA although our check allowed: ACME_CAA, a new order's
    effect (Boulder counts a failed authorization), not a DNS re-check."""
    err = challenge_failure(CAA_ORDER_ERROR)
    assert err.code is E.ACME_CAA and err.problem_type == ERR + "caa"
    assert err.message == (
        "the CA's CAA check refused although ours allowed: " + str(CAA_ORDER_ERROR["detail"])
    )
    # as the answer to finalize, too
    finalize = classify_acme_failure(_boulder("caa", str(CAA_ORDER_ERROR["detail"]), 403))
    assert finalize.code is E.ACME_CAA and refusal_for(ERR + "caa").effect is Effect.NEW_ORDER
    assert challenge_failure(CAA_CHALLENGE).code is E.ACME_CAA


@pytest.mark.parametrize(
    "problem", [CONNECTION_REFUSED, INVALID_RESPONSE_404, NXDOMAIN, TIMEOUT, TLS_ALERT, WRONG_KEY_AUTH]
)
def test_failed_validation_is_an_invalid_order_saying_what_the_ca_found(
    problem: dict[str, Any],
) -> None:
    err = challenge_failure(problem)
    assert err.code is E.ACME_INVALID_ORDER
    assert err.message == f"the CA could not validate the domain: {problem['detail']}"
    assert err.detail == problem["detail"] and err.problem_type == problem["type"]


def test_connection_refused_names_the_address_and_the_url() -> None:
    err = challenge_failure(CONNECTION_REFUSED)
    assert "127.0.0.9" in err.message and "Connection refused" in err.message
    assert "http://shop.example.com/.well-known/acme-challenge/" in err.message


def test_rejected_identifier_in_a_challenge_is_terminal() -> None:
    assert challenge_failure(REJECTED_CHALLENGE).code is E.ACME_REJECTED


def test_challenge_error_without_a_known_type_is_an_invalid_order() -> None:
    # va/va.go: an HTTPS-only server answers probs.Malformed("Server only speaks HTTP, not TLS")
    malformed = {"type": ERR + "malformed", "detail": "Server only speaks HTTP, not TLS"}
    assert challenge_failure(malformed).code is E.ACME_INVALID_ORDER
    assert challenge_failure({"type": ERR + "serverInternal", "detail": "x"}).code is E.ACME_INVALID_ORDER
    assert challenge_failure({"type": ERR + "rateLimited", "detail": "x"}).code is E.ACME_INVALID_ORDER
    empty = challenge_failure(None)
    assert empty.code is E.ACME_INVALID_ORDER and empty.detail == "the order became invalid"


def test_order_of_another_account_stays_an_invalid_order() -> None:
    # wfe2/wfe.go: an order URL of another account
    detail = 'User account ID doesn\'t match account ID in authorization: "2"'
    err = classify_acme_failure(_boulder("unauthorized", detail, 403))
    assert err.code is E.ACME_INVALID_ORDER
    assert err.message.startswith("the CA refused the order:")
    assert classify_acme_failure(HttpStatusError(401, None, "")).code is E.ACME_INVALID_ORDER


@pytest.mark.parametrize(
    ("detail", "status"),
    [
        # wfe2/wfe.go GetOrder / FinalizeOrder: another account's order, or none
        ("No order for ID 4711", 404),
        ("No order found for account ID 12", 404),
        ("Mismatched account ID", 400),
    ],
)
def test_boulders_order_of_another_account_is_an_invalid_order(detail: str, status: int) -> None:
    err = classify_acme_failure(_boulder("malformed", detail, status))
    assert err.code is E.ACME_INVALID_ORDER and err.message == f"the CA refused the order: {detail}"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        # web/probs.go: bad nonces are rewritten to this detail
        (_boulder("badNonce", "JWS has an invalid anti-replay nonce", 400), E.ACME_TEMPORARY),
        (_boulder("serverInternal", "Error creating new order", 500, "60"), E.ACME_TEMPORARY),
        (_boulder("malformed", "Unable to validate JWS :: Request payload did not parse as JSON", 400),
         E.ACME_TEMPORARY),
        (_boulder("orderNotReady", "Order's status (\"pending\") is not acceptable for finalization", 403),
         E.ACME_TEMPORARY),
    ],
)
def test_temporary_faults(exc: Exception, code: ErrorCode) -> None:
    err = classify_acme_failure(exc)
    assert err.code is code and not err.non_retryable


# ------------------------------------------------------------ refused `replaces`

REPLACES = "Could not validate ARI 'replaces' field :: "
CERTIFICATE, FIELD, TEMPORARY = (
    ReplacesRefusal.CERTIFICATE,
    ReplacesRefusal.FIELD,
    ReplacesRefusal.TEMPORARY,
)


@pytest.mark.parametrize(
    ("typ", "detail", "status", "expected"),
    [
        # wfe2/wfe.go validateReplacementOrder (AlreadyReplacedError → probs.AlreadyReplaced, 409)
        ("alreadyReplaced", REPLACES + 'cannot indicate an order replaces certificate with serial'
         ' "03a1b2c3d4e5f60718293a4b5c6d7e8f9a0b", which already has a replacement order', 409,
         CERTIFICATE),
        # parseARICertID (MalformedError, 400; NotFoundError → probs.NotFound: malformed, 404)
        ("malformed", REPLACES + "Invalid path", 400, FIELD),
        ("malformed", REPLACES + "path contained an Authority Key Identifier that did not"
         " match a known issuer", 404, CERTIFICATE),
        # orderMatchesReplacement (NotFound 404, Unauthorized 403, Malformed 400)
        ("malformed", REPLACES + 'request included `replaces` field, but no current certificate'
         ' with serial "03a1" exists', 404, CERTIFICATE),
        ("unauthorized", REPLACES + "requester account did not request the certificate being"
         " replaced by this order", 403, CERTIFICATE),
        ("malformed", REPLACES + "identifiers in this order do not match any identifiers in the"
         " certificate being replaced", 400, FIELD),
        # a CA that wants its own certificate identifier: no field named in the detail
        ("malformed", "Certificate not found for certID aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE", 404,
         CERTIFICATE),
        # errors.New("failed to retrieve existing certificate") → probs.ServerInternal(msg)
        ("serverInternal", "Could not validate ARI 'replaces' field", 500, TEMPORARY),
        ("serverInternal", "could not find an order for the given certificate: not found", 500,
         TEMPORARY),
        # Boulder before #8053 answered 409 conflict
        ("conflict", REPLACES + "cannot indicate an order replaces certificate with serial"
         ' "03a1", which already has a replacement order', 409, CERTIFICATE),
        # not about replaces: handled as any answer
        ("rateLimited", NEW_ORDERS_PER_ACCOUNT, 429, None),
        ("serverInternal", "Error creating new order", 500, None),
    ],
)
def test_a_refused_replaces_is_scoped_as_boulder_scopes_it(
    typ: str, detail: str, status: int, expected: ReplacesRefusal | None
) -> None:
    """Shown red before this change: a 404 "Certificate not found for certID" was no
    refusal of ``replaces`` (ACME_TEMPORARY, the same order for ever) and every
    refusal but 409 switched ``replaces`` off for the account for good."""
    assert replaces_refusal(ERR + typ, detail, status) is expected


def test_a_refused_replaces_without_a_status_reads_the_type() -> None:
    assert replaces_refusal(ERR + "alreadyReplaced", "x", None) is CERTIFICATE
    assert replaces_refusal(ERR + "malformed", "x", None) is FIELD
    assert replaces_refusal(ERR + "serverInternal", "x", None) is None


# ------------------------------------------------------------ codes and schema


def test_new_codes_have_user_messages() -> None:
    assert set(USER_MESSAGES) == set(ErrorCode)
    assert "refused" in USER_MESSAGES[E.ACME_REJECTED]
    assert "/.well-known/acme-challenge/" in USER_MESSAGES[E.HTTP01_UNREACHABLE]


def test_every_error_code_is_admitted_by_the_schema() -> None:
    """The last migration that lists provisioning_error's codes lists every ErrorCode."""
    migrations = sorted(
        (entry for entry in (resources.files("certflow.store") / "migrations").iterdir()
         if entry.name.endswith(".sql")),
        key=lambda entry: int(entry.name.split("_", 1)[0]),
    )
    check = re.compile(r"CHECK\s*\(\s*provisioning_error\s+IN\s*\(([^)]*)\)", re.IGNORECASE)
    admitted: set[str] | None = None
    for entry in migrations:
        for match in check.finditer(entry.read_text()):
            admitted = set(re.findall(r"'([A-Z0-9_]+)'", match.group(1)))
    assert admitted == {str(code) for code in ErrorCode}
