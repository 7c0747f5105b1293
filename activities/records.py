"""Postgres activities: the certificate row's reads and guarded transitions."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from certflow import certificates
from certflow.models import (
    EnsureCertificateInput,
    EnsureCertificateResult,
    PersistChallengeInput,
    ProvisioningPolicy,
    RecordFailureInput,
)


class RecordActivities:
    """Activities on the certificates table."""

    def __init__(
        self, pool: asyncpg.Pool, policy: ProvisioningPolicy, managed_base_domain: str | None
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._managed_base_domain = managed_base_domain

    @activity.defn(name="ensure_certificate")
    async def ensure_certificate(self, input: EnsureCertificateInput) -> EnsureCertificateResult:
        """The row (inserted as PENDING if missing) and this worker's provisioning policy."""
        record = await certificates.ensure_certificate(
            self._pool, input.hostname, input.tenant_id, self._managed_base_domain
        )
        return EnsureCertificateResult(record=record, policy=self._policy)

    @activity.defn(name="persist_challenge")
    async def persist_challenge(self, input: PersistChallengeInput) -> bool:
        """Store the open order and challenge (before it is accepted)."""
        return await certificates.persist_challenge(self._pool, input.certificate_id, input.order)

    @activity.defn(name="record_failure")
    async def record_failure(self, input: RecordFailureInput) -> bool:
        """Apply a failed attempt's outcome; False when the row is gone or done."""
        return await certificates.record_failure(
            self._pool, input.certificate_id, input.outcome, input.message
        )

    @activity.defn(name="reopen_failed")
    async def reopen_failed(self, certificate_id: str) -> bool:
        """Give a FAILED certificate a fresh budget."""
        return await certificates.reopen_failed(self._pool, certificate_id)
