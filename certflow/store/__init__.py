"""Postgres, the system of record: the pool and migrations (``db``); certificate rows
as the workflow moves them (``certificates``), the key and certificate it stores
(``issued``), which CA an attempt goes to (``attempts``), what the product asks and
reads (``requests``), what the responder answers (``challenges``), the TLS edge and
the metrics (``served``), the renewal-info sweep (``renewal_info``), reconcile
(``reconcile``); ACME accounts (``accounts``), rate-limit cooldowns
(``cooldowns``), the event log and its feed (``events``, ``changes``) and key
rotation (``rotation``). Every table of certflow is read and written here only (the
order slots of certflow/acme/slots.py are advisory locks, no table)."""
