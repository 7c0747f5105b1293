"""certflow: ACME certificates for customer hostnames as durable Temporal workflows.

The code both sides share — the product backend that starts workflows and the worker
that runs them — by layer:

- shared types: ``models`` (every payload and row shape), ``errors`` (one tree,
  ``CertflowError``), ``hostnames`` (what a hostname may be), ``contract`` (workflow
  types and ids), ``settings`` and ``issuers`` (configuration), ``crypto``;
- the client side: ``client`` (``CertflowClient``), ``cli`` (the ``certflow``
  command), ``tables``;
- the protocols the worker speaks: ``acme/`` (the CA), ``dns/`` (what the CA will
  see), ``store/`` (Postgres), ``edge/`` (the HTTP-01 responder, TLS serving);
- running a worker: ``logs``, ``metrics``, ``tracing``, ``search`` (attributes),
  ``schedules``.

The workflows and activities are the top-level packages ``workflows`` and
``activities``; the local dev harness is ``devstack`` (never installed).
"""
