"""The designs and patches of the Certificate workflow, each keeping the histories
of older runs replaying, and the bounds its loops keep.

A design bundles what the patches before it changed: a run follows the design
its start (or the run before it) named, not markers. Two designs are supported,
the current one and the one before (docs/changing-the-workflow.md, "Retiring an
old design"); a run of an older one stops at its first workflow task with
:class:`RetiredDesign`, never taking another path than its history's. The
patches retired with designs 1 and 2 are listed in that page."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from certflow.errors import CertflowError

HISTORY_EVENTS_BEFORE_NEW_RUN = 500
"""A run whose history grew past this continues as new at the next turn of its
loop, carrying what its waits need: a certificate waiting for years for DNS, a
failure budget, a cooldown or an order the CA keeps pending never reaches
Temporal's limit. With one turn of the loop at most ~60 events, no run exceeds
1,000 events."""
AT_ONCE_AGE = timedelta(hours=1)
"""A certificate this young whose ARI window is open renews at once; its
replacement, given such a window again, waits for the sweep's next answer."""
FEWER_ROUND_TRIPS_PATCH = "fewer-round-trips"
"""Taken by a first run of design 2 (retired): how a replay recognises one."""
FEWER_ROUND_TRIPS_DESIGN = 2
"""Retired: the Postgres steps and the DNS check local, the self-check and the order
wait one activity (``validate_order``), the patches before it applied without
markers. Design 1 is everything before it."""
ORDER_IN_ONE_STEP_DESIGN = 3
"""Runs whose start asks for it (``CertificateInput.design``: certflow's own starts,
certflow.contract.CERTIFICATE_DESIGN; never a patch marker, so a worker is deployed
before the clients that ask for it), and every run continued as new by code that
knows it: everything of FEWER_ROUND_TRIPS_DESIGN, and

- the order is placed and validated in one activity (``order_and_validate``:
  place_order's, then validate_order's work), the dns-01 TXT published in between
  when the CA's challenge is dns-01 (the activity then stops after placing);
- the search attributes the start set (``CertflowClient.request``) count as shown:
  no upsert repeats them;
- no upsert during an attempt until it waits or ends (``RunState.attributes_held``):
  an order the CA makes ready at once is finalized with the search attributes
  still showing the status before the attempt, so PROVISIONING, and RENEWING on
  the way to ACTIVE, which last a second, are never upserted; an attempt that
  fails or polls again shows its row before it waits.

Ten history events fewer per issuance (30 → 20), a workflow task and an activity
task fewer; seven events, and one billable upsert and one activity, fewer per renewal."""
RUN_KEPT_AFTER_ISSUANCE_DESIGN = 4
"""Runs whose start asks for it, and every run continued as new by code that knows
it: everything of ORDER_IN_ONE_STEP_DESIGN, and after an issuance a run whose
history is shorter than RUN_KEPT_BELOW_EVENTS goes on to wait for the renewal
itself, from the state continue-as-new would have handed the next run
(``CertificateBase._start_over_after_issuance``); a longer one continues as new
as before. A renewal cycle then starts no run: one billable action, a workflow
task and the new run's first events fewer per cycle, most cycles."""
RUN_KEPT_BELOW_EVENTS = 250
"""About a dozen renewal cycles per run (each ~20 events: fifteen cycles of 6-day
certificates made runs of 265 and 45 events with the fakes): the history a
worker replays when a renewal timer fires on a workflow no longer in its cache
stays small."""
RENEW_NEXT_RUN_PATCH = "renew-next-run"
"""A ``renew`` signal, or a transfer's renewal, that reaches the run which has just
issued (phase ISSUED, handing over to the run that waits for the renewal time) is
carried to that next run (``CarriedWaits.renew_requested``), which renews at once;
the run used to clear it with its other requests. Branches in
workflows/certificate.py (``_renew_when_active``); the marker is written only by a
run that meets the case."""
LOST_WORKER_PATCH = "lost-worker"
"""An attempt whose step's last try timed out (its worker killed or stalled: the
attempt ended on no answer of the CA's, no fault of the network's) keeps the failure
budget and the open order the workflow knows of: it waits the failure backoff and
tries again, so worker crashes never make a certificate FAILED; it used to count as
a failed attempt (ACME_TEMPORARY, budget +1). Branch in workflows/failures.py
(``_record_failure``); the marker is written only by a run that meets the case."""
CURRENT_DESIGN = RUN_KEPT_AFTER_ISSUANCE_DESIGN
"""The design every run is brought to (docs/changing-the-workflow.md, "Retiring an
old design"): a run of an older one continues as new in it at its next durable wait
(MIGRATE_AT_WAIT_PATCH), or at once on the ``migrate`` signal."""
MIGRATE_AT_WAIT_PATCH = "migrate-at-wait"
"""A run of a design older than CURRENT_DESIGN (started by a client that asked for
an older one) continues as new in the current design when it is about to start
a wait the next run starts afresh from the row alone (the renewal wait, a DNS
recheck, FAILED), instead of waiting; a run already in one (its wait started
before this code) does so on the ``migrate`` signal
(``starter.py migrate-runs``). A CA's Retry-After, a failure's backoff and an
order's poll are waited out first: they would be cut short. Runs of the current
design never reach the patch: no marker. Branches in workflows/base.py
(``_migrate_at_wait``, ``_sleep``'s ``migrates``)."""
OLDEST_SUPPORTED_DESIGN = ORDER_IN_ONE_STEP_DESIGN
"""The oldest design this code replays: the one before CURRENT_DESIGN."""
UNNAMED_START_PATCH = "unnamed-start-design-4"
"""A first run whose start names no design (a product's own ``start_workflow``, the
contract for other languages) follows UNNAMED_START_DESIGN; before this patch it
followed design 2 (FEWER_ROUND_TRIPS_PATCH)."""
UNNAMED_START_DESIGN = RUN_KEPT_AFTER_ISSUANCE_DESIGN
"""Fixed, not CURRENT_DESIGN: a history replays the design its start took."""


class RetiredDesign(CertflowError):
    """A run of a design this code no longer replays: its workflow task fails (and
    is retried) instead of the run taking another path than its history's."""

    def __init__(self, design: int) -> None:
        super().__init__(
            f"this run follows design {design}, which this worker no longer replays"
            f" (it replays designs {OLDEST_SUPPORTED_DESIGN} and {CURRENT_DESIGN}):"
            " run the release before this one until `starter.py migrate-runs` has"
            " brought every run to its current design, then this one"
            ' (docs/changing-the-workflow.md, "Retiring an old design")'
        )
        self.design = design


def design_of(named: int | None) -> int:
    """The design a run follows: the one its start or the run before it named, else
    the one a first run took by its patch markers. RetiredDesign when it is older
    than OLDEST_SUPPORTED_DESIGN."""
    design = named
    if design is None:
        if workflow.patched(UNNAMED_START_PATCH):
            design = UNNAMED_START_DESIGN
        else:
            design = FEWER_ROUND_TRIPS_DESIGN if workflow.patched(FEWER_ROUND_TRIPS_PATCH) else 1
    if design < OLDEST_SUPPORTED_DESIGN:
        raise RetiredDesign(design)
    return design
