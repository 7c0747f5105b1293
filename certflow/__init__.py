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
4. running: ``connect/`` (reaching Temporal and Postgres from either side: a
   client's ``settings``, ``temporal_config``, ``payload_codec``,
   ``connections``), ``running/`` (a worker's: ``worker_settings``, ``logs``,
   ``tracing``, ``schedules``), ``product/starts`` (how certflow starts a
   workflow) and ``edge/settings``;
5. entry points: ``product/`` (``client``, ``CertflowClient``; ``cli`` and
   ``commands``, the ``certflow`` command, with its ``tables`` and ``runs``;
   ``domain_checks``; ``codec_server``) and ``edge/process`` (``certflow edge``).

What both sides share sits at the top (layers 1 and 2, and ``metrics``); each
folder is one wing: ``acme/``, ``dns/``, ``store/`` and ``edge/`` the protocols,
``connect/`` reaching the servers, ``running/`` a worker, ``product/`` what the
product and operators call.

The activities (``activities``) import certflow; the workflows (``workflows``)
import both; nothing in certflow imports either. The local dev harness is
``devstack`` (never installed).
"""
