"""Private keys, CSRs, certificate parsing and the at-rest encryption format.

Encryption is compatible with the original system: AES-256-GCM, stored bytes
= 12-byte random nonce || ciphertext || 16-byte tag, no associated data; the
plaintext is the PEM private key.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from cryptography import x509
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import NameOID

from certflow.errors import CertflowError

NONCE_SIZE = 12
TAG_SIZE = 16

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class KeyType(StrEnum):
    """Private key algorithm for issued certificates."""

    EC256 = "EC256"
    EC384 = "EC384"
    RSA2048 = "RSA2048"
    RSA4096 = "RSA4096"

class DecryptionError(CertflowError):
    """Stored key material does not decrypt with the configured key."""


class EncryptionKey:
    """An AES-256-GCM key, plus the retired keys that may still decrypt (rotation).

    New values are always encrypted with the current key. Its repr never shows a key.
    """

    __slots__ = ("_aead", "_old")

    def __init__(self, raw: bytes, old: Sequence[bytes] = ()) -> None:
        if len(raw) != 32 or any(len(k) != 32 for k in old):
            raise ValueError("encryption keys must be 32 bytes")
        self._aead = AESGCM(raw)
        self._old = [AESGCM(k) for k in old]

    def __repr__(self) -> str:
        return f"EncryptionKey(<redacted>, {len(self._old)} old)"

    def encrypt(self, plaintext: bytes) -> bytes:
        nonce = os.urandom(NONCE_SIZE)
        return nonce + self._aead.encrypt(nonce, plaintext, None)

    def decrypt(self, blob: bytes) -> bytes:
        return self.decrypt_with_origin(blob)[0]

    def decrypt_with_origin(self, blob: bytes) -> tuple[bytes, bool]:
        """(plaintext, whether the current key decrypted it)."""
        if len(blob) < NONCE_SIZE + TAG_SIZE:
            raise DecryptionError("encrypted value is too short")
        for index, aead in enumerate([self._aead, *self._old]):
            try:
                return aead.decrypt(blob[:NONCE_SIZE], blob[NONCE_SIZE:], None), index == 0
            except InvalidTag:
                continue
        raise DecryptionError(
            "stored key does not decrypt with CERTFLOW_ENCRYPTION_KEY"
            " or CERTFLOW_ENCRYPTION_KEYS_OLD (wrong key?)"
        )


def generate_private_key(key_type: KeyType) -> PrivateKey:
    if key_type is KeyType.EC256:
        return ec.generate_private_key(ec.SECP256R1())
    if key_type is KeyType.EC384:
        return ec.generate_private_key(ec.SECP384R1())
    size = 2048 if key_type is KeyType.RSA2048 else 4096
    return rsa.generate_private_key(public_exponent=65537, key_size=size)


def private_key_to_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_private_key(pem: bytes) -> PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise ValueError(f"unsupported key type {type(key).__name__}")
    return key


# RFC 5280 ub-common-name: a longer CN is refused by cryptography and by Let's Encrypt.
MAX_COMMON_NAME_OCTETS = 64


def make_csr(key: PrivateKey, hostname: str) -> bytes:
    """A PEM CSR with a single DNS SAN for hostname, also the subject CN when it
    fits in 64 octets (otherwise the subject is empty; the SAN is what counts)."""
    subject = (
        [x509.NameAttribute(NameOID.COMMON_NAME, hostname)]
        if len(hostname.encode()) <= MAX_COMMON_NAME_OCTETS
        else []
    )
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name(subject))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class CertificateInfo:
    """What certflow records about an issued leaf certificate."""

    serial_hex: str
    not_before: datetime
    not_after: datetime


def split_fullchain(fullchain_pem: str) -> tuple[str, str]:
    """Split a PEM chain into (leaf PEM, intermediates PEM)."""
    certs = x509.load_pem_x509_certificates(fullchain_pem.encode())
    if not certs:
        raise ValueError("empty certificate chain")
    pems = [c.public_bytes(serialization.Encoding.PEM).decode() for c in certs]
    return pems[0], "".join(pems[1:])


def certificate_info(leaf_pem: str) -> CertificateInfo:
    cert = x509.load_pem_x509_certificate(leaf_pem.encode())
    return CertificateInfo(
        serial_hex=format(cert.serial_number, "x"),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
    )


def public_key_matches(leaf_pem: str, key: PrivateKey) -> bool:
    """Whether the certificate was issued for this private key."""
    cert = x509.load_pem_x509_certificate(leaf_pem.encode())
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)
