"""Postgres, the system of record: the pool and migrations (``db``), certificate rows
and their guarded transitions (``certificates``), what the TLS edge serves and the
metrics read (``served``), ACME accounts (``accounts``), rate-limit cooldowns
(``cooldowns``), the event log and its feed (``events``, ``changes``) and key
rotation (``rotation``). Every table of certflow is read and written here only (the
order slots of certflow/acme/slots.py are advisory locks, no table)."""
