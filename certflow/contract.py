"""Names a product backend in any language relies on: workflow types, ids, and
the schedule (docs/contract.md: "The contract for backends in other languages").

The ``status`` query, the ``retry``/``renew``/``cancel``/``delete`` signals and
updates are named on the workflow itself (workflows/certificate.py).
"""

from __future__ import annotations

CERTIFICATE_WORKFLOW = "Certificate"
"""One per hostname, for the certificate's whole life."""
RECONCILE_WORKFLOW = "Reconcile"
"""One reconcile pass, started by the schedule."""
WEBHOOK_DELIVERY_WORKFLOW = "WebhookDelivery"
"""Delivers one webhook event, a child of the Certificate workflow that outlives it."""
RENEWAL_INFO_SWEEP_WORKFLOW = "RenewalInfoSweep"
"""One pass asking the CA's ARI about every due certificate, started by its schedule."""
DOMAIN_CHECK_WORKFLOW = "DomainCheck"
"""Runs every pre-check of one hostname, orders nothing (``starter.py check``)."""


def workflow_id_for(hostname: str) -> str:
    """The deterministic workflow id: one workflow per hostname, single flight by construction."""
    return f"certificate:{hostname}"


def reconcile_schedule_id(task_queue: str) -> str:
    """One schedule per task queue (a namespace may host several deployments)."""
    return f"certflow-reconcile:{task_queue}"


def renewal_info_sweep_schedule_id(task_queue: str) -> str:
    return f"certflow-renewal-info:{task_queue}"


def domain_check_workflow_id(hostname: str, check_id: str) -> str:
    return f"check:{hostname}:{check_id}"


def webhook_workflow_id(hostname: str, event_id: str) -> str:
    """One delivery workflow per event: each event is delivered once."""
    return f"webhook:{hostname}:{event_id}"

CERTIFICATE_DESIGN = 4
"""The design of the Certificate workflow that certflow's own starts ask for
(``CertificateInput.design``; workflows/patches.py says what each changes). A
worker is deployed before the clients that ask for its design; a worker that
knows only an older one runs the newest it knows."""
