"""How certflow starts a hostname's Certificate workflow (``CertflowClient.request``,
reconcile): with the design this release asks for, and with the search attributes
a requested row shows, so its first run records no patch marker and repeats no
upsert (workflows/patches.py, ORDER_IN_ONE_STEP_DESIGN)."""

from __future__ import annotations

import logging

from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from certflow import search
from certflow.contract import CERTIFICATE_DESIGN, CERTIFICATE_WORKFLOW, workflow_id_for
from certflow.hostnames import Hostname
from certflow.models import CertificateRecord, CertificateStatus, RequestedMethod
from certflow.workflow_payloads import CertificateInput

log = logging.getLogger(__name__)


def certificate_input(
    hostname: Hostname,
    tenant_id: str | None,
    method: RequestedMethod | None = None,
    requested: CertificateRecord | None = None,
) -> CertificateInput:
    """The Certificate workflow's input as certflow starts it (``requested``: the
    row a request has just written)."""
    return CertificateInput(
        hostname=hostname, tenant_id=tenant_id, method=method, design=CERTIFICATE_DESIGN, requested=requested
    )


def requested_attributes(
    hostname: Hostname, tenant_id: str | None, *, with_hostname: bool = True
) -> TypedSearchAttributes:
    """What the search attributes of a row just requested show: PENDING, no error,
    no certificate; the tenant when the request names it (else the workflow
    upserts the row's once it has read it); the hostname unless left out
    (CERTFLOW_HOSTNAME_SEARCH_ATTRIBUTE=false)."""
    pairs: list[SearchAttributePair[str]] = [SearchAttributePair(search.STATUS, str(CertificateStatus.PENDING))]
    if with_hostname:
        pairs.insert(0, SearchAttributePair(search.HOSTNAME, hostname))
    if tenant_id is not None:
        pairs.append(SearchAttributePair(search.TENANT, tenant_id))
    return TypedSearchAttributes(pairs)


class CertificateStarts:
    """Starts Certificate workflows on one task queue, or finds the one running."""

    def __init__(self, temporal: Client, task_queue: str, *, hostname_attribute: bool = True) -> None:
        self._temporal = temporal
        self._task_queue = task_queue
        self._hostname_attribute = hostname_attribute
        self._with_attributes = True
        """False once the namespace refused them (not registered: the worker could
        not register them either, and its workflows run without them)."""

    async def start(
        self,
        hostname: Hostname,
        tenant_id: str | None,
        method: RequestedMethod | None = None,
        requested: CertificateRecord | None = None,
    ) -> None:
        """Start the hostname's workflow unless one runs (then nothing changes);
        ``requested``, the row a request has just written, spares its first read."""
        while True:
            try:
                await self._temporal.start_workflow(
                    CERTIFICATE_WORKFLOW,
                    certificate_input(hostname, tenant_id, method, requested),
                    id=workflow_id_for(hostname),
                    task_queue=self._task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                    search_attributes=requested_attributes(
                        hostname, tenant_id, with_hostname=self._hostname_attribute
                    )
                    if self._with_attributes
                    else None,
                )
                return
            except RPCError as err:
                # "Namespace … has no mapping defined for search attribute …"
                unregistered = (
                    err.status is RPCStatusCode.INVALID_ARGUMENT and "search attribute" in err.message
                )
                if not self._with_attributes or not unregistered:
                    raise
                log.warning("starting without search attributes: %s", err.message)
                self._with_attributes = False
