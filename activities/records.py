"""Postgres activities: the certificate row's reads and guarded transitions."""

from __future__ import annotations

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from certflow.contract import workflow_id_for
from certflow.errors import FailureType
from certflow.hostnames import InvalidHostnameError, normalize_hostname
from certflow.metrics import CertflowMetrics
from certflow.store import certificates
from certflow.models import CertificateRecord
from certflow.activity_payloads import (
    GiveUpInput,
    EnsureCertificateInput,
    EnsureCertificateResult,
    PersistChallengeInput,
    RecordFailureInput,
    OpenOrder,
    Transition,
)
from certflow.workflow_payloads import ProvisioningPolicy


def _refusal(hostname: str) -> InvalidHostnameError | None:
    """Why ``hostname`` is not a valid name in its canonical spelling, or None."""
    try:
        canonical = normalize_hostname(hostname)
    except InvalidHostnameError as err:
        return err
    if canonical != hostname:
        return InvalidHostnameError(
            hostname,
            f"not in canonical form: request {canonical} (workflow id {workflow_id_for(canonical)})",
        )
    return None


def _transition(row: CertificateRecord | None) -> Transition:
    """A guarded transition's answer from the row it returned (None: not applied)."""
    return Transition(applied=row is not None, row=row)


class RecordActivities:
    """Activities on the certificates table."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        policy: ProvisioningPolicy,
        managed_base_domain: str | None,
        metrics: CertflowMetrics | None = None,
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._managed_base_domain = managed_base_domain
        self._metrics = metrics or CertflowMetrics()

    @activity.defn(name="ensure_certificate")
    async def ensure_certificate(self, input: EnsureCertificateInput) -> EnsureCertificateResult:
        """The row (inserted as PENDING if missing) and this worker's provisioning policy.

        The hostname of a workflow a backend started itself is checked here, its
        first step, before anything is written: one that is not valid, or not in its
        canonical spelling (the one its workflow id must carry), ends the workflow
        with InvalidHostnameError. A name a workflow already ran for is never refused
        (a newer IDNA mapping must not end a live certificate)."""
        refusal = _refusal(input.hostname)
        requested = input.requested
        if refusal is None and requested is not None and self._as_requested(input, requested):
            # The workflow is marked as run (reconcile's cue) by the attempt's first
            # write instead: its try at an order slot, or its failure.
            return EnsureCertificateResult(record=requested, policy=self._policy)
        if refusal is not None and not await certificates.run_before(self._pool, input.hostname):
            raise ApplicationError(
                str(refusal), type=FailureType.INVALID_HOSTNAME, non_retryable=True
            )
        record = await certificates.ensure_certificate(
            self._pool, input.hostname, input.tenant_id, self._managed_base_domain, input.method
        )
        return EnsureCertificateResult(record=record, policy=self._policy)

    def _as_requested(self, input: EnsureCertificateInput, requested: CertificateRecord) -> bool:
        """Whether the row a request has just written is the row as a read would
        return it: the same hostname and method, and no managed-domain lookup due
        (``skips_dns``)."""
        base = self._managed_base_domain
        managed = base is not None and (
            input.hostname == base or input.hostname.endswith(f".{base}")
        )
        return (
            requested.hostname == input.hostname
            and input.method in (None, requested.requested_method)
            and not managed
        )

    @activity.defn(name="give_up")
    async def give_up(self, input: GiveUpInput) -> Transition:
        """Stop trying: CANCELED (ABANDONED) or EXPIRED (DEPARTED), with why."""
        row, first = await certificates.give_up(
            self._pool,
            input.certificate_id,
            input.status,
            input.code,
            input.message,
            self._managed_base_domain,
        )
        if first:  # not again when an attempt is retried after its commit
            self._metrics.given_up(str(input.code).lower())
        return _transition(row)

    @activity.defn(name="persist_challenge")
    async def persist_challenge(self, input: PersistChallengeInput) -> bool:
        """Store the open order and challenge (before it is accepted)."""
        row = await certificates.persist_challenge(self._pool, input.certificate_id, input.order)
        return row is not None

    @activity.defn(name="record_failure")
    async def record_failure(self, input: RecordFailureInput) -> Transition:
        """Apply a failed attempt's outcome; not applied when the row is gone or done."""
        return _transition(
            await certificates.record_failure(
                self._pool,
                input.certificate_id,
                input.outcome,
                input.message,
                self._managed_base_domain,
            )
        )

    # Registered under its first name, which histories hold.
    @activity.defn(name="load_certificate")
    async def reload_record(self, certificate_id: str) -> CertificateRecord:
        """The row as it now is (CERTIFICATE_GONE when it was deleted)."""
        return await self._load(certificate_id)

    @activity.defn(name="reopen_failed")
    async def reopen_failed(self, certificate_id: str) -> CertificateRecord:
        """Give a FAILED certificate a fresh budget; returns the row as it now is."""
        row = await certificates.reopen_failed(self._pool, certificate_id, self._managed_base_domain)
        return row if row is not None else await self._load(certificate_id)

    @activity.defn(name="begin_renewal")
    async def begin_renewal(self, certificate_id: str) -> Transition:
        """ACTIVE → RENEWING."""
        return _transition(
            await certificates.begin_renewal(self._pool, certificate_id, self._managed_base_domain)
        )

    @activity.defn(name="mark_expired")
    async def mark_expired(self, certificate_id: str) -> Transition:
        """RENEWING → EXPIRED once the old certificate lapsed."""
        return _transition(
            await certificates.mark_expired(self._pool, certificate_id, self._managed_base_domain)
        )

    @activity.defn(name="cancel_certificate")
    async def cancel_certificate(self, certificate_id: str) -> OpenOrder:
        """Status CANCELED; returns the order that was open, if any, and the row."""
        order_url, row = await certificates.cancel(
            self._pool, certificate_id, self._managed_base_domain
        )
        return OpenOrder(order_url=order_url, row=row)

    @activity.defn(name="delete_certificate")
    async def delete_certificate(self, certificate_id: str) -> bool:
        """Remove the rows."""
        return await certificates.delete(self._pool, certificate_id)

    async def _load(self, certificate_id: str) -> CertificateRecord:
        record = await certificates.load_record(
            self._pool, certificate_id, self._managed_base_domain
        )
        if record is None:
            raise ApplicationError(
                f"certificate {certificate_id} no longer exists",
                type=FailureType.CERTIFICATE_GONE,
                non_retryable=True,
            )
        return record
