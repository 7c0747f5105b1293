"""ACME Renewal Information (RFC 9773): asking the CA when to renew one certificate.

:func:`renewal_info_url` says where to ask, :func:`fetch_renewal_info` asks, and
:func:`next_check` says when to ask again. The sweep that asks for every due
certificate is activities/renewal_info.py.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import requests
from acme import messages
from acme.client import _renewal_info_path_component  # acme's RFC 9773 certificate id
from cryptography import x509
from temporalio import activity

from certflow.acme.account import AcmeClients
from certflow.acme.network import parse_retry_after
from certflow.activity_payloads import RenewalAdvice

ARI_DEFAULT_RECHECK = 6 * 3600.0  # RFC 9773 §4.3.3
MIN_RECHECK = 1.0  # the sweep's own interval paces it anyway
MAX_RECHECK = 7 * 86400.0


def renewal_info_url(base_url: str, leaf_pem: str) -> str | None:
    """Where to ask about this certificate; None once it expired (RFC 9773 §4.3:
    never ask about an expired certificate)."""
    cert = x509.load_pem_x509_certificate(leaf_pem.encode())
    if cert.not_valid_after_utc <= datetime.now(timezone.utc):
        return None
    return f"{base_url.rstrip('/')}/{_renewal_info_path_component(cert)}"


async def fetch_renewal_info(
    clients: AcmeClients, executor: ThreadPoolExecutor, url: str, timeout: float = 15.0
) -> RenewalAdvice:
    """The CA's suggested window. Failures (503 + Retry-After included) only ask to
    check again later; they never fail anything."""

    def get() -> requests.Response:
        # A plain GET (RFC 9773 §4.1); an error status is an answer, not a failure.
        with clients.borrow() as client:
            return client.net.session.get(url, verify=clients.account.verify, timeout=timeout)

    try:
        response = await asyncio.get_running_loop().run_in_executor(executor, get)
    except Exception as exc:  # the CA unreachable: ask again later
        activity.logger.warning("renewal info unavailable: %s", exc)
        return RenewalAdvice(recheck_after_seconds=ARI_DEFAULT_RECHECK)
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    if not response.ok:
        return RenewalAdvice(recheck_after_seconds=retry_after or ARI_DEFAULT_RECHECK)
    try:
        info = messages.RenewalInfo.from_json(response.json())
    except Exception:
        return RenewalAdvice(recheck_after_seconds=retry_after or ARI_DEFAULT_RECHECK)
    return RenewalAdvice(
        window_start=info.suggested_window.start,
        window_end=info.suggested_window.end,
        recheck_after_seconds=retry_after or ARI_DEFAULT_RECHECK,
    )


def next_check(advice: RenewalAdvice) -> datetime:
    """When to ask about this certificate again: the answer's Retry-After, bounded."""
    seconds = min(max(advice.recheck_after_seconds or ARI_DEFAULT_RECHECK, MIN_RECHECK), MAX_RECHECK)
    return datetime.now(timezone.utc) + timedelta(seconds=seconds)
