"""certflow: ACME certificates for customer hostnames as durable Temporal workflows.

The code both sides share — the product backend that starts workflows and the worker
that runs them — in five layers, each importing only from the layers before it
(``tests/unit/test_house_rules.py`` holds the same table and checks every import):

1. foundations: ``errors`` (one tree, ``CertflowError``), ``hostnames`` (what a
   hostname may be; ``host:port``), ``models`` (statuses, methods, scopes, row
   shapes), ``contract`` (workflow types and ids), ``issuers`` (the CAs),
   ``crypto`` (keys, their types, at-rest encryption), ``search`` (attributes);
2. payloads: ``workflow_payloads`` (what clients and workflows exchange),
   ``activity_payloads`` (what workflows and activities exchange);
3. the protocols the worker speaks and what it records: ``acme/`` (the CA),
   ``dns/`` (what the CA will see), ``store/`` (Postgres), ``metrics``, and
   ``edge/`` (the HTTP-01 responder, TLS serving, keeping an edge current);
4. running: ``settings`` and ``worker_settings`` (a client's, the worker's),
   ``temporal_config`` and ``connections`` (reaching Temporal and Postgres),
   ``payload_codec``, ``logs``, ``tracing``, ``schedules``, ``starts``,
   ``edge/settings``;
5. entry points: ``client`` (``CertflowClient``), ``cli`` and ``commands`` (the
   ``certflow`` command), ``tables``, ``domain_checks``, ``codec_server``,
   ``edge/process`` (``certflow edge``).

The activities (``activities``) import certflow; the workflows (``workflows``)
import both; nothing in certflow imports either. The local dev harness is
``devstack`` (never installed).
"""
