"""ACME Renewal Information (RFC 9773): asking the CA when to renew.

:func:`fetch_renewal_info` asks about one certificate. :class:`RenewalInfoSweep`
asks about every ACTIVE certificate that is due, in pages, on a schedule — one
activity for thousands of certificates instead of an activity and a timer per
certificate per check — stores each answer (window, next check from the
answer's Retry-After) and signals only the workflows whose window moved; each
certificate's workflow sleeps to its renewal time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import asyncpg
import requests
from acme import messages
from acme.client import _renewal_info_path_component  # acme's RFC 9773 certificate id
from cryptography import x509
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from activities.acme_client import AcmeClients, parse_retry_after
from activities.pacing import PollPacer
from certflow import certificates
from certflow.certificates import RenewalInfoRow
from certflow.contract import workflow_id_for
from certflow.models import RenewalAdvice, RenewalInfoSweepResult, RenewalWindow

ARI_DEFAULT_RECHECK = 6 * 3600.0  # RFC 9773 §4.3.3
MIN_RECHECK = 1.0  # the sweep's own interval paces it anyway
MAX_RECHECK = 7 * 86400.0
PAGE = 500
CONCURRENCY = 8
RENEWAL_WINDOW_SIGNAL = "renewal_window"


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


class RenewalInfoSweep:
    """The renewal-info sweep: every due ACTIVE certificate's ARI, paced."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        issuers: AcmeClients | Sequence[AcmeClients],
        executor: ThreadPoolExecutor,
        client: Client,
        requests_per_second: float = 20.0,
    ) -> None:
        self._pool = pool
        self._issuers = [issuers] if isinstance(issuers, AcmeClients) else list(issuers)
        self._executor = executor
        self._client = client
        self._pacer = PollPacer(requests_per_second)

    @activity.defn(name="sweep_renewal_info")
    async def sweep_renewal_info(self) -> RenewalInfoSweepResult:
        """Ask the CA that issued each certificate whose next check is due; store the
        answers; signal the workflows whose window moved."""
        if not any(c.account_url and c.account.directory_json.get("renewalInfo") for c in self._issuers):
            return RenewalInfoSweepResult()  # no CA has ARI: the lifetime rule holds
        asked = moved = 0
        slots = asyncio.Semaphore(CONCURRENCY)
        while True:
            due = await certificates.renewal_info_due(self._pool, PAGE)
            if not due:
                break

            async def one(row: RenewalInfoRow) -> tuple[RenewalInfoRow, RenewalAdvice]:
                clients = self._issuer_of(row)
                if clients is not None and clients.account_url is None:
                    # No account there yet (its CA did not answer): ask again later.
                    return row, RenewalAdvice(recheck_after_seconds=ARI_DEFAULT_RECHECK)
                base_url = clients.account.directory_json.get("renewalInfo") if clients else None
                url = renewal_info_url(str(base_url), row.leaf_pem) if base_url else None
                if clients is None or url is None:
                    # That CA has no ARI (or is no longer configured): the lifetime rule.
                    return row, RenewalAdvice(recheck_after_seconds=MAX_RECHECK)
                async with slots:
                    await self._pacer.acquire()
                    return row, await fetch_renewal_info(clients, self._executor, url)

            answers = await asyncio.gather(*(one(r) for r in due))
            asked += len(answers)
            await certificates.record_renewal_info(
                self._pool,
                [
                    (row.certificate_id, row.serial, a.window_start, a.window_end, next_check(a))
                    for row, a in answers
                ],
            )
            for row, advice in answers:
                if _moved(row, advice):
                    moved += 1
                    await self._signal(row, advice)
            activity.heartbeat(asked)
            if len(due) < PAGE:
                break
        return RenewalInfoSweepResult(asked=asked, moved=moved)

    def _issuer_of(self, row: RenewalInfoRow) -> AcmeClients | None:
        if row.issuer is None:
            return self._issuers[0]
        return next((c for c in self._issuers if c.issuer.name == row.issuer), None)

    async def _signal(self, row: RenewalInfoRow, advice: RenewalAdvice) -> None:
        assert advice.window_start is not None and advice.window_end is not None
        window = RenewalWindow(start=advice.window_start, end=advice.window_end, serial=row.serial)
        try:
            await self._client.get_workflow_handle(workflow_id_for(row.hostname)).signal(
                RENEWAL_WINDOW_SIGNAL, window
            )
        except RPCError as err:  # no workflow running: reconcile starts it, it reads the row
            activity.logger.info("no workflow to tell of %s's new window: %s", row.hostname, err)


def next_check(advice: RenewalAdvice) -> datetime:
    """When to ask about this certificate again: the answer's Retry-After, bounded."""
    seconds = min(max(advice.recheck_after_seconds or ARI_DEFAULT_RECHECK, MIN_RECHECK), MAX_RECHECK)
    return datetime.now(timezone.utc) + timedelta(seconds=seconds)


def _moved(row: RenewalInfoRow, advice: RenewalAdvice) -> bool:
    if advice.window_start is None or advice.window_end is None:
        return False  # no answer: the window stored (or the lifetime rule) still holds
    return (advice.window_start, advice.window_end) != (row.window_start, row.window_end)
