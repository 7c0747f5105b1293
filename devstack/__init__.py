"""The local dev harness: real servers for the demo, the benchmarks and the tests.

``servers`` starts Pebble, the Temporal dev server, embedded Postgres and workers
on loopback; ``realdns`` a real authoritative server (Knot) and recursive resolver
(Unbound) where DNS semantics matter; ``faultproxy`` sits in front of Pebble and
answers as a real CA does when it refuses; ``demo`` is ``starter.py demo``;
``key_capture`` records every key a worker generates, for the leak tests.

It is no part of certflow: nothing in ``certflow``, ``workflows``, ``activities``
or ``worker.py`` imports it, and the wheel (``pip install .``, the Dockerfile)
does not carry it. It runs from a checkout, with the ``dev`` extra installed.
"""
