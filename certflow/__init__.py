"""certflow: ACME certificates for customer hostnames as durable Temporal workflows.

The code both sides share — the product backend that starts workflows and the worker
that runs them — by layer:

- shared types: ``models`` (statuses, methods, scopes, row shapes),
  ``workflow_payloads`` (what clients and workflows exchange),
  ``activity_payloads`` (what workflows and activities exchange), ``errors`` (one
  tree, ``CertflowError``), ``hostnames`` (what a hostname may be), ``contract``
  (workflow types and ids), ``settings`` and ``worker_settings`` (configuration: a
  client's, the worker's), ``issuers`` (the CAs), ``crypto``;
- the client side: ``client`` (``CertflowClient``), ``cli`` (the ``certflow``
  command), ``tables``;
- the protocols the worker speaks: ``acme/`` (the CA), ``dns/`` (what the CA will
  see), ``store/`` (Postgres), ``edge/`` (the HTTP-01 responder, TLS serving);
- running a worker: ``logs``, ``metrics``, ``tracing``, ``search`` (attributes),
  ``schedules``.

The workflows and activities are the top-level packages ``workflows`` and
``activities``; the local dev harness is ``devstack`` (never installed).
"""
