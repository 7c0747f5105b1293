"""Throwaway certificates for the edge's unit tests: a leaf and its key as PEM."""

from __future__ import annotations

from cryptography import x509

from devstack.pki import make_ca, make_leaf


def leaf(hostname: str) -> tuple[str, bytes]:
    """(certificate PEM, PKCS#8 key PEM) for hostname, from a CA of its own."""
    issued = make_leaf(make_ca(f"{hostname} test CA"), hostname, "server", [x509.DNSName(hostname)])
    return issued.cert_pem.decode(), issued.key_pem
