"""The local dev harness: real servers for the demo, the benchmarks and the tests.

``devstack`` starts Pebble, the Temporal dev server, embedded Postgres and
workers on loopback; ``realdns`` a real authoritative server (Knot) and
recursive resolver (Unbound) where DNS semantics matter; ``faultproxy`` sits in
front of Pebble and answers as a real CA does when it refuses; ``demo`` is
``starter.py demo``. None of it is in
the wheel (``pip install .`` and the Dockerfile ship ``certflow`` without
``certflow.dev``): it runs from a checkout, with the ``dev`` extra installed.
"""
