"""The renewal-info sweep (RFC 9773 ARI; asking about one certificate is
certflow/acme/ari.py). :class:`RenewalInfoSweep`
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

import asyncpg
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from activities.pass_heartbeat import PassHeartbeat
from activities.pass_metrics import counted_pass
from certflow.acme.ari import (
    ARI_DEFAULT_RECHECK,
    MAX_RECHECK,
    fetch_renewal_info,
    next_check,
    renewal_info_url,
)
from certflow.acme.account import AcmeClients
from certflow.acme.pacing import PollPacer
from certflow.store import renewal_info
from certflow.store.renewal_info import RenewalInfoRow
from certflow.contract import workflow_id_for
from certflow.activity_payloads import RenewalAdvice
from certflow.workflow_payloads import RenewalInfoSweepResult, RenewalWindow

PAGE = 500
CONCURRENCY = 8
RENEWAL_WINDOW_SIGNAL = "renewal_window"


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
        async with counted_pass("renewal_info_sweep"):
            return await self._sweep()

    async def _sweep(self) -> RenewalInfoSweepResult:
        if not any(c.account_url and c.account.directory_json.get("renewalInfo") for c in self._issuers):
            return RenewalInfoSweepResult()  # no CA has ARI: the lifetime rule holds
        asked = moved = 0
        heartbeat = PassHeartbeat()
        slots = asyncio.Semaphore(CONCURRENCY)
        while True:
            due = await renewal_info.renewal_info_due(self._pool, PAGE)
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
            await renewal_info.record_renewal_info(
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
            # Only once the sweep runs long (a page takes ~25 s at the default pace):
            # a sweep of a few pages sends none.
            heartbeat.maybe(asked)
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


def _moved(row: RenewalInfoRow, advice: RenewalAdvice) -> bool:
    if advice.window_start is None or advice.window_end is None:
        return False  # no answer: the window stored (or the lifetime rule) still holds
    return (advice.window_start, advice.window_end) != (row.window_start, row.window_end)
