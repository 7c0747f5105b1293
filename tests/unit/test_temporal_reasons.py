"""What the Temporal SDK raises when a connection is refused, as the one plain reason
certflow prints, naming the setting to check. The messages are the SDK's own
(temporalio 1.35, recorded against HAProxy in front of the dev server,
devstack/temporal_tls.py): over TLS 1.3 a refused client certificate shows as
any of several post-handshake errors, a race between the server's alert and
the client's first call, so each variant is here.

Red when a variant is not mapped: the reason is then the raw text, which names
no setting (checked once with the after-handshake branch taken out: the three
race variants failed)."""

from __future__ import annotations

import pytest
from temporalio.service import TLSConfig

from certflow.connect.connections import _temporal_reason
from certflow.connect.temporal_config import TemporalConnection

AFTER = "Failed client connect: `get_system_info` call error after connection: "
CONNECT = "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { kind: InvalidData, error: "

MTLS = TemporalConnection(
    "127.0.0.1:7234",
    "default",
    tls=TLSConfig(server_root_ca_cert=b"ca", domain="temporal.certflow.test", client_cert=b"c", client_private_key=b"k"),
    ca_setting="CERTFLOW_TEMPORAL_TLS_CA",
    server_name_setting="CERTFLOW_TEMPORAL_TLS_SERVER_NAME",
    client_cert_setting="CERTFLOW_TEMPORAL_TLS_CERT",
)
TLS_ONLY = TemporalConnection(
    "127.0.0.1:7234", "default", tls=TLSConfig(server_root_ca_cert=b"ca"), ca_setting="TEMPORAL_TLS_SERVER_CA_CERT_PATH"
)
API_KEY = TemporalConnection(
    "127.0.0.1:7235", "default", tls=TLSConfig(), api_key="k", api_key_setting="TEMPORAL_API_KEY"
)
PLAIN = TemporalConnection("127.0.0.1:7233", "default")

CASES = [
    # (connection, the SDK's message, words of the reason, the setting named)
    (TLS_ONLY, AFTER + 'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: InvalidData, error: "received fatal alert: CertificateRequired" }))) }', "client certificate", "CERTFLOW_TEMPORAL_TLS_CERT"),
    (TLS_ONLY, AFTER + 'Status { code: Cancelled, message: "operation was canceled", source: Some(tonic::transport::Error(Transport, hyper::Error(Canceled, "connection closed"))) }', "client certificate", "CERTFLOW_TEMPORAL_TLS_CERT"),
    (TLS_ONLY, AFTER + 'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: BrokenPipe, error: "stream closed because of a broken pipe" }))) }', "client certificate", "CERTFLOW_TEMPORAL_TLS_CERT"),
    (MTLS, AFTER + 'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: InvalidData, error: "received fatal alert: UnknownCA" }))) }', "client certificate", "CERTFLOW_TEMPORAL_TLS_CERT"),
    (MTLS, AFTER + 'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: BrokenPipe, error: "connection closed because of a broken pipe" }))) }', "client certificate", "CERTFLOW_TEMPORAL_TLS_CERT"),
    (MTLS, CONNECT + 'InvalidCertificate(NotValidForNameContext { expected: DnsName("wrong.certflow.test"), presented: ["DnsName(\\"temporal.certflow.test\\")"] }) }))', "not valid for the name", "CERTFLOW_TEMPORAL_TLS_SERVER_NAME"),
    (MTLS, CONNECT + "InvalidCertificate(UnknownIssuer) }))", "not signed by", "CERTFLOW_TEMPORAL_TLS_CA"),
    (API_KEY, AFTER + 'Status { code: Internal, message: "protocol error: received message with invalid compression flag: 60 (valid flags are 0 and 1) while receiving response with status: 401 Unauthorized", metadata: MetadataMap { headers: {} }, source: None }', "API key was refused", "TEMPORAL_API_KEY"),
    (API_KEY, AFTER + 'Status { code: Unauthenticated, message: "invalid API key", metadata: MetadataMap { headers: {} }, source: None }', "API key was refused", "TEMPORAL_API_KEY"),
    (API_KEY, CONNECT + "InvalidMessage(InvalidContentType) }))", "does not speak TLS", "CERTFLOW_TEMPORAL_ADDRESS"),
    (PLAIN, AFTER + 'Status { code: Unknown, message: "transport error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Kind(ConnectionReset)))) }', "does it need TLS", "CERTFLOW_TEMPORAL_TLS"),
]


@pytest.mark.parametrize(("connection", "message", "words", "setting"), CASES)
def test_each_refusal_names_what_to_check(
    connection: TemporalConnection, message: str, words: str, setting: str
) -> None:
    reason = _temporal_reason(message, connection)
    assert words in reason and setting in reason, reason
    assert "\n" not in reason
