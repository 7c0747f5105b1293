"""Throwaway certificates for the rigs (TLS in front of Temporal, a TLS-only
Postgres): a CA and the leaves it signs, every one X.509 v3 with its extensions
(the Temporal SDK's rustls rejects v1 certificates), EC P-256, valid for 30 days."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Role = Literal["ca", "server", "client"]


@dataclass(frozen=True)
class Issued:
    """A certificate and its key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey = field(repr=False)
    ski: x509.SubjectKeyIdentifier = field(repr=False)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def _key_usage(role: Role) -> x509.KeyUsage:
    ca = role == "ca"
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)


def make_ca(common_name: str) -> Issued:
    """A self-signed root (basic constraints, key usage, SKI)."""
    start, end = _validity()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage("ca"), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key, ski)


def make_leaf(
    issuer: Issued, common_name: str, role: Literal["server", "client"], sans: Sequence[x509.GeneralName] = ()
) -> Issued:
    """A leaf ``issuer`` signs: serverAuth or clientAuth, ``sans`` its SAN (none: no SAN)."""
    start, end = _validity()
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    eku = ExtendedKeyUsageOID.SERVER_AUTH if role == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(role), critical=True)
        .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer.ski), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return Issued(builder.sign(issuer.key, hashes.SHA256()), key, ski)


def write_private(path: Path, data: bytes) -> None:
    """A key file, 0600 before any key byte lands in it (a rerun may find it there)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(data)


def self_signed(name: str) -> tuple[x509.Certificate, bytes, bytes]:
    """(certificate, its PEM, its key's PEM) of a self-signed leaf for name, as an
    edge's default certificate or a planted row's (30 days, EC P-256)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    not_before, not_after = _validity()
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert, cert.public_bytes(serialization.Encoding.PEM), key_pem
