"""Benchmark of certflow against two bare ``acme`` baselines on real local servers.

Run ``python -m bench --help`` from the repository root. Nothing here is
imported by certflow itself.
"""
