"""Encryption format and key/certificate helpers."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import NameOID

from certflow.crypto import (
    NONCE_SIZE,
    TAG_SIZE,
    DecryptionError,
    EncryptionKey,
    certificate_info,
    generate_private_key,
    load_private_key,
    make_csr,
    private_key_to_pem,
    public_key_matches,
    split_fullchain,
)
from certflow.crypto import KeyType

RAW_KEY = bytes(range(32))


def test_round_trip() -> None:
    key = EncryptionKey(RAW_KEY)
    plaintext = private_key_to_pem(generate_private_key(KeyType.EC256))
    blob = key.encrypt(plaintext)
    assert key.decrypt(blob) == plaintext
    assert plaintext not in blob


def test_byte_layout_is_nonce_ciphertext_tag_and_plain_aesgcm_decrypts_it() -> None:
    plaintext = b"pem bytes"
    blob = EncryptionKey(RAW_KEY).encrypt(plaintext)
    assert len(blob) == NONCE_SIZE + len(plaintext) + TAG_SIZE
    nonce, rest = blob[:NONCE_SIZE], blob[NONCE_SIZE:]
    assert AESGCM(RAW_KEY).decrypt(nonce, rest, None) == plaintext


def test_blob_written_by_a_plain_aesgcm_call_decrypts() -> None:
    nonce = b"\x01" * 12
    blob = nonce + AESGCM(RAW_KEY).encrypt(nonce, b"from the Go system", None)
    assert EncryptionKey(RAW_KEY).decrypt(blob) == b"from the Go system"


def test_nonces_differ() -> None:
    key = EncryptionKey(RAW_KEY)
    assert key.encrypt(b"x")[:NONCE_SIZE] != key.encrypt(b"x")[:NONCE_SIZE]


def test_wrong_key_is_a_clear_error() -> None:
    blob = EncryptionKey(RAW_KEY).encrypt(b"secret")
    with pytest.raises(DecryptionError, match="CERTFLOW_ENCRYPTION_KEY"):
        EncryptionKey(bytes(32)).decrypt(blob)
    with pytest.raises(DecryptionError, match="too short"):
        EncryptionKey(RAW_KEY).decrypt(b"short")


def test_key_is_never_shown() -> None:
    assert "redacted" in repr(EncryptionKey(RAW_KEY))
    with pytest.raises(ValueError):
        EncryptionKey(b"16 bytes only...")


@pytest.mark.parametrize(
    ("key_type", "kind", "size"),
    [
        (KeyType.EC256, ec.EllipticCurvePrivateKey, 256),
        (KeyType.EC384, ec.EllipticCurvePrivateKey, 384),
        (KeyType.RSA2048, rsa.RSAPrivateKey, 2048),
    ],
)
def test_generated_keys(key_type: KeyType, kind: type, size: int) -> None:
    key = generate_private_key(key_type)
    assert isinstance(key, kind) and key.key_size == size
    assert load_private_key(private_key_to_pem(key)).key_size == size


def test_csr_has_cn_and_single_san() -> None:
    key = generate_private_key(KeyType.EC256)
    csr = x509.load_pem_x509_csr(make_csr(key, "shop.example.com"))
    assert csr.is_signature_valid
    cn = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [a.value for a in cn] == ["shop.example.com"]
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["shop.example.com"]


@pytest.mark.parametrize(("length", "has_cn"), [(64, True), (65, False), (70, False)])
def test_csr_cn_only_when_it_fits_in_64_octets(length: int, has_cn: bool) -> None:
    # A valid name (labels of at most 63 octets) of exactly ``length`` octets.
    hostname = "a" * 40 + "." + "b" * (length - 41 - len(".example.com")) + ".example.com"
    assert len(hostname) == length
    key = generate_private_key(KeyType.EC256)
    csr = x509.load_pem_x509_csr(make_csr(key, hostname))
    assert csr.is_signature_valid
    cn = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    assert cn == ([hostname] if has_cn else [])
    if not has_cn:
        assert len(csr.subject) == 0
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [hostname]


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer_key: ec.EllipticCurvePrivateKey) -> str:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")]))
        .public_key(key.public_key())
        .serial_number(0xABCDEF)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=90))
        .sign(issuer_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_split_info_and_key_match() -> None:
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    ca_key = ec.generate_private_key(ec.SECP256R1())
    leaf, intermediate = _cert("leaf", leaf_key, ca_key), _cert("intermediate", ca_key, ca_key)
    got_leaf, chain = split_fullchain(leaf + intermediate)
    assert got_leaf == leaf and chain == intermediate
    info = certificate_info(leaf)
    assert info.serial_hex == "abcdef"
    assert info.not_after - info.not_before == datetime.timedelta(days=90)
    assert public_key_matches(leaf, leaf_key)
    assert not public_key_matches(leaf, ca_key)
    with pytest.raises(ValueError):
        split_fullchain("")
