"""What one run of the Certificate workflow knows and waits on, in one typed record.

The row as last read or written, what the product sees (phase, next wake-up), the
requests that signals and updates leave for the loop, the attempt's issuer and
what it fell back from, and the renewal's memory of windows that were open at
once. :class:`CarriedWaits` is the part of it a continue-as-new hands over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from certflow.errors import CertflowError
    from certflow.hostnames import Hostname
    from certflow.models import CertificateRecord, Phase
    from certflow.workflow_payloads import (
        CaaDisagreement,
        CarriedWaits,
        CertificateInput,
        ProvisioningPolicy,
    )


class Stopped(CertflowError):
    """Cancel or delete was requested while an attempt ran: a signal within the
    workflow, caught by its loop (workflows/certificate.py), never raised out of it."""


@dataclass(frozen=True)
class StopRequest:
    """Cancel, or delete (and then whether to revoke first)."""

    delete: bool
    revoke: bool


@dataclass
class RunState:
    """The run's state; the workflow's methods are its only writers."""

    hostname: Hostname
    current: CertificateRecord | None
    """The row as this run knows it. Carried over a continue-as-new, so queries and
    updates are answered right away in the new run, before the row is read again."""
    policy: ProvisioningPolicy = field(default_factory=ProvisioningPolicy)
    design: int = 1
    """The design this workflow's runs follow (workflows/patches.py)."""
    after_issuance: bool = False
    """This run follows an issuance: started by code that has every patch, and with
    the search attributes of the carried row (continue-as-new copies them)."""

    row_read_at: datetime | None = None
    """When the run last read the row (workflow time): read in the current workflow
    task, the DNS check takes its method and tenant from the record."""

    # -- what the product sees
    phase: Phase = Phase.STARTING
    next_attempt_at: datetime | None = None
    published: tuple[object, ...] | None = None
    """What the search attributes show now (upserted only when it changes)."""
    attributes_held: bool = False
    """No upsert for now (order-in-one-step design): an attempt under way, which
    releases it before it waits and when it ends, so the search attributes show
    what it comes to (ACTIVE, the failure, or the order it polls) and never a
    status that lasted a second (PROVISIONING, RENEWING on the way to ACTIVE)."""

    # -- what signals and updates ask of the loop
    migrate_requested: bool = False
    """The ``migrate`` signal came: a run of an older design continues as new in the
    current one as soon as it waits (workflows/base.py, ``_migrate_at_wait``)."""
    retry_requested: bool = False
    renew_requested: bool = False
    renew_next_run: bool = False
    """A renewal asked for after the issuance, in the ISSUED phase: the run that
    waits for the renewal time starts it at once (workflows/patches.py
    RENEW_NEXT_RUN_PATCH)."""
    retry_cuts_wait: bool = False
    """The wait under way is one ``retry`` ends (the retry update answers after it)."""
    window_moved: bool = False
    """The renewal-info sweep signalled a new ARI window for the current certificate."""
    stop: StopRequest | None = None
    stopped: bool = False

    # -- the attempt: its CA, chosen from those CAA allows, falling back from one that
    # cannot issue (histories from before issuers: None throughout)
    issuer: str | None = None
    issuer_reason: str | None = None
    allowed: list[str] = field(default_factory=list)
    passed_over: dict[str, str] = field(default_factory=dict)
    unreachable_since: datetime | None = None
    fell_back: bool = False
    caa_reading: str | None = None
    """The attempt's reading of the deciding CAA set (None: not read this attempt)."""
    caa_disagreements: dict[str, CaaDisagreement] = field(default_factory=dict)
    """CAs whose own CAA check refused although ours allowed, with our reading then."""
    accepted_challenge: str | None = None
    """The challenge the CA answered an accept for: never POSTed again."""
    dns_failures: int = 0
    pending_since: datetime | None = None
    """Since when a never-issued hostname has had no validation method ready."""
    departed_at: datetime | None = None
    """When the certificate expired with the hostname no longer routed to us."""

    # -- the renewal
    renewed_at_once: bool = False
    """The certificate waited on replaced one that renewed at once for an ARI window
    already open when it was young (CarriedWaits.renewed_at_once)."""
    renewing_at_once: bool = False
    """The renewal under way is such a renewal."""
    ari_hold_released: bool = False
    """The renewal-info sweep answered since a second at-once window was held."""
    warned_expiring: bool = False

    @classmethod
    def starting(cls, input: CertificateInput) -> RunState:
        """A run's state from its input: fresh, or what the last run carried."""
        waits = input.waits or CarriedWaits()
        state = cls(
            hostname=input.hostname,
            current=input.carried,
            retry_requested=waits.retry_requested,
            renew_requested=waits.renew_requested,
            renewed_at_once=waits.renewed_at_once,
            warned_expiring=waits.warned_expiring,
            dns_failures=waits.dns_failures,
            passed_over=dict(waits.passed_over),
            unreachable_since=waits.unreachable_since,
            caa_disagreements=dict(waits.caa_disagreements),
            accepted_challenge=waits.accepted_challenge,
            pending_since=waits.pending_since,
            departed_at=waits.departed_at,
        )
        if input.carried is not None and input.policy is not None:
            state.after_issuance = True
            state.policy = input.policy
        return state

    @property
    def record(self) -> CertificateRecord:
        """The row as this run knows it (read at the start of every run)."""
        assert self.current is not None
        return self.current

    def carried_waits(self) -> CarriedWaits:
        """What the waits need in the next run, when this one hands over mid-wait."""
        return CarriedWaits(
            dns_failures=self.dns_failures,
            warned_expiring=self.warned_expiring,
            renewed_at_once=self.renewed_at_once,
            passed_over=self.passed_over,
            unreachable_since=self.unreachable_since,
            caa_disagreements=self.caa_disagreements,
            accepted_challenge=self.accepted_challenge,
            retry_requested=self.retry_requested,
            renew_requested=self.renew_requested,
            pending_since=self.pending_since,
            departed_at=self.departed_at,
        )
