"""The patches of the Certificate workflow (``workflow.patched``), each keeping the
histories of older runs replaying, and the bounds its loops keep."""

from __future__ import annotations

from datetime import timedelta

# Patches (workflow.patched): each keeps the histories of older runs replaying.
FOLLOW_MOVED_ROW_PATCH = "follow-moved-row"
"""A failure that finds the row moved on re-reads the row instead of ending the workflow."""
PLACE_ORDER_PATCH = "place-order"
"""One place_order activity (create + persist) instead of create_order and
persist_challenge, and the accept inside the first wait_for_order instead of
accept_challenge: two round trips fewer per certificate."""
RENEWAL_INFO_SWEEP_PATCH = "renewal-info-sweep"
"""An ACTIVE certificate sleeps to its renewal time, spread per certificate (jitter
without ARI; an ARI window that runs to notAfter cut to leave room for failures),
its ARI window kept current by the renewal-info sweep's signal, instead of asking
the CA itself on every re-check."""
BOUNDED_HISTORY_PATCH = "bounded-history"
"""A run whose history grew past HISTORY_EVENTS_BEFORE_NEW_RUN continues as new at
the next turn of its loop, carrying what its waits need: a certificate waiting
for years for DNS, a failure budget or a cooldown never reaches Temporal's limit."""
HISTORY_EVENTS_BEFORE_NEW_RUN = 500
"""With one turn of the loop at most ~60 events, no run exceeds 1,000 events."""
COOLDOWN_SPREAD_PATCH = "cooldown-spread"
"""Waiting workflows resume spread out when a rate-limit cooldown ends, not all at once."""
HTTP01_SELF_CHECK_PATCH = "http01-self-check"
"""The persisted challenge is fetched as the CA would fetch it before it is accepted."""
BOUNDED_COOLDOWN_WAIT_PATCH = "bounded-cooldown-wait"
"""A cooldown wait that ``retry`` keeps cutting short goes back to the main loop (which
continues as new) once the run is long, instead of waiting on in the same run."""
BOUNDED_ORDER_POLL_PATCH = "bounded-order-poll"
"""Polling an order the CA keeps pending continues as new past
HISTORY_EVENTS_BEFORE_NEW_RUN events too, the open order on the row."""
ARI_ONCE_PER_WINDOW_PATCH = "ari-once-per-window"
"""A certificate an hour old or less whose ARI window is already open renews once; its
replacement, given such a window again, waits for the sweep's next answer."""
AT_ONCE_AGE = timedelta(hours=1)
"""A certificate this young whose ARI window is open renews at once."""
NOT_READY_WEBHOOK_PATCH = "not-ready-webhook"
"""A ``not_ready`` webhook when a hostname starts waiting for the customer (no
validation method ready, ownership unproven) or waits for another reason than
before: the product tells the customer what to add without polling ``status``.
Branch in workflows/failures.py (``_record_failure``)."""
GIVE_UP_PATCH = "give-up"
"""A never-issued hostname with no validation method ready for PENDING_TIMEOUT_DAYS is
CANCELED (ABANDONED); an expired one no longer routed to us (DEPARTED) stops
re-checking DEPARTED_RETENTION_DAYS after it expired. Branches in
workflows/failures.py (``_wait_after``) and workflows/renew.py (``_expire_if_lapsed``)."""
FEWER_ROUND_TRIPS_PATCH = "fewer-round-trips"
"""Taken once, on a workflow's first run: its runs follow FEWER_ROUND_TRIPS_DESIGN
(``RunState.design``, carried over continue-as-new in ``CertificateInput.design``):
the Postgres steps and the DNS check run as local activities, the self-check and
the order wait as one activity (``validate_order``), and every patch
above counts as applied without its marker (``CertificateBase._patched``). About
half the history events and workflow tasks of an issuance. Patches added after it
call ``workflow.patched`` as before."""
FEWER_ROUND_TRIPS_DESIGN = 2
"""The design of runs started by code with FEWER_ROUND_TRIPS_PATCH (1: before it)."""
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
an older one, or by a start that asked for none) continues as new in the current
design when it is about to start a wait the next run starts afresh from the row
alone (the renewal wait, a DNS recheck, FAILED), instead of waiting; a run already
in one (its wait started before this code) does so on the ``migrate`` signal
(``starter.py migrate-runs``). A CA's Retry-After, a failure's backoff and an
order's poll are waited out first: they would be cut short. Runs of the current
design never reach the patch: no marker. Branches in workflows/base.py
(``_migrate_at_wait``, ``_sleep``'s ``migrates``)."""
