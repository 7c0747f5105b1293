"""The Temporal workflows: ``certificate`` (one per hostname, its whole lifecycle,
in phase files: obtain, failures, renew, stop), and the small ones around it —
``reconcile`` and ``renewal_info_sweep`` (scheduled), ``domain_check`` (``check``),
``webhooks`` (one delivery). Deterministic: every decision is a pure function in
``policy``; every side effect an activity, called by typed reference (``steps``)."""
