"""End to end, after issuance: renew, serve by SNI across a renewal, cancel, delete
with revocation, reconcile, and renewal at the CA's ARI window (RFC 9773).

Most tests use the session deployment. Two need a CA the session cannot offer
(ARI, and an HTTP-01 validation that hangs so the order stays pending): each
gets a dedicated Pebble + challtestsrv behind a fault proxy that serves
``renewalInfo``, with its own database and worker (``proxied``).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import secrets
import ssl
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import josepy
import pytest
import requests
from acme import client as acme_client
from acme import messages
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from temporalio.client import WorkflowExecutionStatus

from devstack import servers
from certflow.crypto import EncryptionKey, load_private_key, public_key_matches
from certflow.store.db import create_pool
from devstack.faultproxy import Endpoint, Fault, FaultProxy, start_fault_proxy
from certflow.workflow_payloads import CertificateState
from certflow.edge.serving import SniCertificates
from certflow.connect.settings import ClientSettings
from certflow.product.client import CertflowClient
from certflow.hostnames import normalize_hostname
from certflow.workflow_payloads import CertificateState
from temporalio.service import RPCError

from tests.e2e.conftest import CNAME_TARGET, Deployment, reconcile_schedule_paused
from tests.expected import renewal_time as renew_at

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
UTC = datetime.timezone.utc
SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


# ----------------------------------------------------------------------------- helpers


async def _wait_for(
    client: CertflowClient,
    hostname: str,
    predicate: Callable[[CertificateState], bool],
    timeout: float = WAIT,
    what: str = "condition",
) -> CertificateState:
    deadline = time.monotonic() + timeout
    while True:
        report = await client.status(hostname)
        if report is not None and predicate(report):
            return report
        if time.monotonic() > deadline:
            raise AssertionError(f"{hostname}: {what} not reached in {timeout:.0f} s; last {report}")
        await asyncio.sleep(0.05)


async def _row(db: asyncpg.Pool, hostname: str) -> asyncpg.Record:
    row = await db.fetchrow("SELECT * FROM certificates WHERE hostname = $1", hostname)
    assert row is not None, f"no row for {hostname}"
    return row


def _settled_active(report: CertificateState) -> bool:
    """ACTIVE, and the workflow's current run has loaded it and waits for the renewal
    time."""
    return report.status == "ACTIVE" and "renewal time" in (report.phase or "")


async def _issue(client: CertflowClient, hostname: str) -> CertificateState:
    await client.request([hostname])
    return await _wait_for(client, hostname, _settled_active, what="ACTIVE, waiting for renewal")


async def _wait_closed(client: CertflowClient, hostname: str, timeout: float = 15.0) -> Any:
    """The workflow's description once its (latest) run is no longer running."""
    deadline = time.monotonic() + timeout
    while True:
        description = await client.handle(hostname).describe()
        if description.status is not WorkflowExecutionStatus.RUNNING:
            return description
        assert time.monotonic() < deadline, f"{hostname}: workflow still running"
        await asyncio.sleep(0.05)


def _public_key_der(encryption_key: EncryptionKey, encrypted: bytes) -> bytes:
    return load_private_key(encryption_key.decrypt(encrypted)).public_key().public_bytes(*SPKI)


def _ari_cert_id(leaf: x509.Certificate) -> str:
    """RFC 9773 §4.1, computed here independently of the product and of acme."""
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier is not None
    serial = leaf.serial_number
    serial_der = serial.to_bytes(serial.bit_length() // 8 + 1, "big")  # room for the sign bit

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    return f"{b64(aki.key_identifier)}.{b64(serial_der)}"


# ------------------------------------------------------------------------- a. renew


async def test_renew_stores_a_different_certificate_and_key(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    hostname = deployment.hostname("renew")
    await _issue(client, hostname)
    old = await _row(db, hostname)
    old_key = _public_key_der(deployment.encryption_key, bytes(old["encrypted_ssl_private_key"]))

    answered = await client.renew(hostname)
    assert answered.hostname == hostname

    report = await _wait_for(
        client,
        hostname,
        lambda r: r.status == "ACTIVE" and r.serial not in (None, old["ssl_serial"]),
        what="ACTIVE with a new serial",
    )
    new = await _row(db, hostname)
    print(f"\nrenewed {hostname}: serial {old['ssl_serial']} -> {new['ssl_serial']}")
    assert report.serial == new["ssl_serial"] != old["ssl_serial"]
    assert new["ssl_certificate"] != old["ssl_certificate"]
    new_private = load_private_key(
        deployment.encryption_key.decrypt(bytes(new["encrypted_ssl_private_key"]))
    )
    assert new_private.public_key().public_bytes(*SPKI) != old_key, "the renewal reused the key"
    assert public_key_matches(new["ssl_certificate"], new_private)
    assert new["ssl_not_before"] >= old["ssl_not_before"]
    assert new["provisioning_error"] is None
    assert new["http_order_url"] is None and new["pending_private_key"] is None

    # The next run waits for the 1/3 rule (Pebble advertises no renewalInfo).
    waiting = await _wait_for(
        client,
        hostname,
        lambda r: r.next_attempt_at is not None and "renewal time" in (r.phase or ""),
        what="waiting for the renewal time",
    )
    expected = renew_at(hostname, new["ssl_not_before"], new["ssl_expires_at"])
    assert waiting.next_attempt_at is not None
    assert abs((waiting.next_attempt_at - expected).total_seconds()) < 1


async def test_renew_right_after_issuance_is_accepted(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    """A renew sent the moment the certificate is stored, while the run that issued
    hands over to the renewal wait (in itself, or to the run it continues as new
    into), renews."""
    hostname = deployment.hostname("renew-race")
    await client.request([hostname])
    deadline = time.monotonic() + WAIT
    while (old := await _row(db, hostname))["status"] != "ACTIVE":
        assert time.monotonic() < deadline, "never issued"
        await asyncio.sleep(0.005)
    assert old["ssl_serial"]

    await client.renew(hostname)  # answered at once, whatever the handover's stage

    await _wait_for(
        client,
        hostname,
        lambda r: r.status == "ACTIVE" and r.serial not in (None, old["ssl_serial"]),
        what="ACTIVE with a new serial",
    )


# ---------------------------------------------------------------------------- b. SNI


def _throwaway_server_files(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for the base context (never sent to a verified client)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sni-default.invalid")])
    now = datetime.datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "default-cert.pem", directory / "default-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def _handshake(port: int, hostname: str, root_pem: str) -> x509.Certificate:
    """A verifying TLS client (trusting only Pebble's root): the leaf it was served."""
    context = ssl.create_default_context(cadata=root_pem)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=hostname), 10
    )
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True)
        assert await asyncio.wait_for(reader.readline(), 10) == b"hello\n"
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ssl.SSLError, ConnectionError):
            pass
    return x509.load_der_x509_certificate(der)


async def test_sni_server_serves_the_renewed_certificate_without_restart(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool, tmp_path: Path
) -> None:
    hostname = deployment.hostname("sni")
    await _issue(client, hostname)
    root_pem = deployment.pebble.root_pem()

    certs = SniCertificates(db, deployment.encryption_key, refresh_seconds=0.5)
    assert await certs.refresh() >= 1
    first_serial = (await _row(db, hostname))["ssl_serial"]
    assert certs.serial_for(hostname) == first_serial

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_throwaway_server_files(tmp_path))
    context.sni_callback = certs.sni_callback

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello\n")
        try:
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        leaf = await _handshake(port, hostname, root_pem)
        assert format(leaf.serial_number, "x") == first_serial

        # Control: a name the callback does not know gets the throwaway, which fails
        # verification, so the successes above and below are real verifications.
        with pytest.raises(ssl.SSLCertVerificationError):
            await _handshake(port, deployment.bare_hostname("unknown"), root_pem)

        await client.renew(hostname)
        await _wait_for(
            client,
            hostname,
            lambda r: r.status == "ACTIVE" and r.serial not in (None, first_serial),
            what="ACTIVE with a new serial",
        )
        second_serial = (await _row(db, hostname))["ssl_serial"]

        # With run() going, the new certificate is picked up within refresh_seconds.
        refresher = asyncio.create_task(certs.run())
        try:
            deadline = time.monotonic() + 10
            while certs.serial_for(hostname) != second_serial:
                assert time.monotonic() < deadline, "SniCertificates never picked up the renewal"
                await asyncio.sleep(0.05)
        finally:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)

        leaf = await _handshake(port, hostname, root_pem)  # same server, no restart
        assert format(leaf.serial_number, "x") == second_serial
        assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == hostname
        print(f"\nSNI {hostname}: served {first_serial}, then {second_serial} after renewal")
    finally:
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------- c. cancel (DNS wait)


async def test_cancel_during_dns_wait(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    hostname = deployment.bare_hostname("cancel-dns")  # no CNAME: DNS_CNAME, waiting
    await client.request([hostname])
    await _wait_for(
        client,
        hostname,
        lambda r: r.error_code == "DNS_CNAME" and r.phase is not None and "DNS" in r.phase,
        what="waiting for DNS",
    )

    state = await client.cancel(hostname)
    assert state.status == "CANCELED"
    assert state.phase == "canceled"
    row = await _row(db, hostname)
    assert row["status"] == "CANCELED"
    assert row["http_order_url"] is None

    description = await _wait_closed(client, hostname)
    assert description.status is WorkflowExecutionStatus.COMPLETED
    handle = client.temporal.get_workflow_handle(
        f"certificate:{hostname}", result_type=CertificateState
    )
    result = await handle.result()
    assert result.status == "CANCELED"


# ------------------------------------------------------------- d. delete --revoke (CLI)


async def test_cli_delete_with_revoke(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    hostname = deployment.hostname("revoke")
    await _issue(client, hostname)
    serial = (await _row(db, hostname))["ssl_serial"]
    assert deployment.pebble.cert_status_by_serial(serial)["Status"] == "Valid"

    keep = ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "starter.py", "delete", hostname, "--revoke",
        cwd=ROOT,
        env={**clean, **{k: deployment.env[k] for k in keep}},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, (stdout.decode(), stderr.decode())
    assert f"{hostname}: deleted" in stdout.decode()

    assert await db.fetchrow("SELECT 1 FROM certificates WHERE hostname = $1", hostname) is None
    status = deployment.pebble.cert_status_by_serial(serial)
    assert status["Status"] == "Revoked", status
    description = await _wait_closed(client, hostname)
    assert description.status is WorkflowExecutionStatus.COMPLETED


# --------------------------------------------------------------------------- e. reconcile


async def test_reconcile_starts_a_row_inserted_directly_once(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    """A product inserts rows by SQL, spelled as it likes: upper case and a trailing
    dot, a U-label, and a name that is no hostname at all. Reconcile gives each valid
    one the spelling ``request`` computes (one row, one workflow, whoever asks next),
    refuses the invalid one with a reason, and starts nothing twice.

    Checked: with reconcile starting ``certificate:<hostname as stored>`` (no
    normalization) the U-label row got a second workflow and the later request a
    second row; without the trigger the upper-case spelling did."""
    plain = deployment.hostname("reconcile")
    unique = plain.split(".", 1)[1]
    u_label = f"bücher-{unique.split('.')[0]}.test"
    a_label = normalize_hostname(u_label)
    deployment.pebble.set_cname(a_label, CNAME_TARGET)
    invalid = f"bad_name.{unique}"
    async with reconcile_schedule_paused(client, "rows planted by SQL"):
        for stored in (plain.upper() + ".", u_label, invalid):
            await db.execute("INSERT INTO certificates (hostname) VALUES ($1)", stored)
        assert await db.fetchval(
            "SELECT hostname::text FROM certificates WHERE hostname = $1", plain
        ) == plain  # the trigger made the stored spelling canonical

        first = await client.reconcile_now()
        assert plain in first.started and a_label in first.started, first
        assert invalid in first.refused, first
        refused = await db.fetchrow(
            "SELECT status, provisioning_error, provisioning_error_message FROM certificates"
            " WHERE hostname = $1",
            invalid,
        )
        assert (refused["status"], refused["provisioning_error"]) == ("CANCELED", "INVALID_HOSTNAME")
        assert "underscore" in refused["provisioning_error_message"]
        assert await db.fetchval(
            "SELECT count(*) FROM certificate_events WHERE hostname = $1"
            " AND to_status = 'CANCELED' AND error_code = 'INVALID_HOSTNAME'",
            invalid,
        ) == 1
        with pytest.raises(RPCError):
            await client.temporal.get_workflow_handle(f"certificate:{invalid}").describe()

        for hostname in (plain, a_label):
            await _wait_for(
                client,
                hostname,
                lambda r: r.status == "ACTIVE" and "renewal time" in (r.phase or ""),
                what="ACTIVE and waiting for renewal",
            )
        run_ids = {h: (await client.handle(h).describe()).run_id for h in (plain, a_label)}

        # The product now requests the same names as a user types them: same rows, same runs.
        assert await client.request([plain.upper(), u_label]) == [plain, a_label]
        second = await client.reconcile_now()
        assert not {plain, a_label} & set(second.started), second
        for hostname in (plain, a_label):
            assert (await client.handle(hostname).describe()).run_id == run_ids[hostname]
            assert (await client.status(hostname)).status == "ACTIVE"  # type: ignore[union-attr]
        rows = await db.fetchval(
            "SELECT count(*) FROM certificates WHERE hostname = ANY($1::citext[])",
            [plain, a_label, u_label],
        )
        assert rows == 2


# ------------------------------------------- dedicated deployments behind a fault proxy

PROXIED_CNAME_TARGET = "edge.proxied.test"


@dataclass
class ProxiedDeployment:
    """Its own Pebble (only one worker per Pebble can own its HTTP-01 port), a fault
    proxy in front serving ARI, its own database and worker, on the session Temporal."""

    pebble: servers.PebbleStack
    proxy: FaultProxy
    env: dict[str, str]
    worker: servers.WorkerProcess
    encryption_key: EncryptionKey
    ari_window: tuple[datetime.datetime, datetime.datetime]
    client: CertflowClient
    db: asyncpg.Pool

    def hostname(self, label: str) -> str:
        host = f"{label}.c{uuid.uuid4().hex[:10]}.test"
        self.pebble.set_cname(host, PROXIED_CNAME_TARGET)
        return host

    def worker_log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.worker.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
async def proxied(
    temporal: servers.TemporalDevServer,
    new_database: Callable[[], str],
    tmp_path: Path,
) -> AsyncIterator[ProxiedDeployment]:
    """A fresh one per test: Pebble 2.4.0 wedges once a deactivated authorization's
    validation completes (see the cancel-while-polling test), so none is shared."""
    pebble = servers.start_pebble(tmp_path / "pebble", nonce_reject_percent=0)
    proxy = start_fault_proxy(pebble, tmp_path / "pebble")
    try:
        # The worker reads the directory once, at start: advertise ARI first.
        now = datetime.datetime.now(UTC)
        window = proxy.serve_renewal_info(
            now + datetime.timedelta(hours=2), now + datetime.timedelta(hours=4), retry_after="3600"
        )
        raw_key = secrets.token_bytes(32)
        env = servers.certflow_environment(
            pebble=pebble,
            temporal_address=temporal.address,
            database_url=new_database(),
            encryption_key=base64.b64encode(raw_key).decode(),
            cname_target=PROXIED_CNAME_TARGET,
            task_queue=f"certflow-proxied-{uuid.uuid4().hex[:6]}",
            extra={
                "CERTFLOW_ACME_DIRECTORY_URL": proxy.directory_url,
                "CERTFLOW_RECONCILE_INTERVAL_SECONDS": "0",
                "CERTFLOW_RENEWAL_INFO_SWEEP_SECONDS": "1",
                # Its cancel-while-polling test needs the CA's validation to hang at an
                # address where the self-check would hang too (tests/e2e/
                # test_preflight_real_dns.py is where the self-check is proven).
                "CERTFLOW_HTTP01_SELF_CHECK": "false",
                "CERTFLOW_ORDER_FAST_POLL_SECONDS": "2",
                "CERTFLOW_DNS_RECHECK_INITIAL_SECONDS": "1",
                "CERTFLOW_FAILURE_BACKOFF_INITIAL_SECONDS": "1",
            },
        )
        worker = servers.start_worker(tmp_path, env, name="worker-proxied")
        try:
            client = await CertflowClient.connect(
                ClientSettings(
                    database_url=env["CERTFLOW_DATABASE_URL"],
                    temporal_address=env["CERTFLOW_TEMPORAL_ADDRESS"],
                    task_queue=env["CERTFLOW_TASK_QUEUE"],
                )
            )
            db = await create_pool(env["CERTFLOW_DATABASE_URL"], max_size=2)
            try:
                yield ProxiedDeployment(
                    pebble, proxy, env, worker, EncryptionKey(raw_key), window, client, db
                )
            finally:
                await db.close()
                await client.close()
        finally:
            worker.stop()
    finally:
        proxy.stop()
        pebble.stop()


def _account_client(stack: ProxiedDeployment, account_url: str, pem: bytes) -> acme_client.ClientV2:
    """An ACME client signing as certflow's own account (to read its authorizations)."""
    private = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    verify: Any = str(stack.pebble.ca_bundle)  # requests takes a bundle path
    net = acme_client.ClientNetwork(
        josepy.jwk.JWKEC(key=private), alg=josepy.jwa.ES256, verify_ssl=verify
    )
    net.account = messages.RegistrationResource(body=messages.Registration(), uri=account_url)
    directory = acme_client.ClientV2.get_directory(stack.proxy.directory_url, net)
    return acme_client.ClientV2(directory, net)


class _Blackhole:
    """Accepts TCP connections and never answers: an HTTP-01 validation that hangs."""

    def __init__(self) -> None:
        self.connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            self._writers.append(writer)
            await reader.read()  # until the peer gives up

        self._server = await asyncio.start_server(swallow, host, port)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()


# --------------------------------------------------------------- c. cancel (polling)


async def test_cancel_while_polling_deactivates_the_open_authorization(
    proxied: ProxiedDeployment,
) -> None:
    client, db = proxied.client, proxied.db
    # The CA's validation of the edge hangs (nothing answers on 127.0.0.2), so the
    # order stays pending and the workflow keeps polling it.
    blackhole = _Blackhole()
    await blackhole.start("127.0.0.2", proxied.pebble.http01_port)
    proxied.pebble.add_a(PROXIED_CNAME_TARGET, ["127.0.0.2"])
    try:
        hostname = proxied.hostname("cancel-poll")
        await client.request([hostname])
        await _wait_for(
            client,
            hostname,
            lambda r: "polling" in (r.phase or ""),
            timeout=30,
            what="the polling phase",
        )
        row = await _row(db, hostname)
        assert row["status"] == "PROVISIONING"
        order_url = row["http_order_url"]
        assert order_url and order_url.startswith(proxied.proxy.url)
        deadline = time.monotonic() + 5
        while blackhole.connections == 0:  # the CA really is validating (and hanging)
            assert time.monotonic() < deadline, "the CA never tried to validate"
            await asyncio.sleep(0.02)

        started = time.monotonic()
        state = await client.cancel(hostname)
        took = time.monotonic() - started
        assert state.status == "CANCELED", state
        row = await _row(db, hostname)
        assert row["status"] == "CANCELED"
        assert row["http_order_url"] is None and row["http_challenge_token"] is None

        # At the CA: the authorization that was open is now deactivated. Read it while
        # the validation still hangs: Pebble 2.4.0 leaks a challenge read lock when it
        # displays a deactivated authorization (wfe.prepAuthorizationForDisplay), and
        # the validation finishing then wedges that Pebble for good (hence one per test).
        account = await db.fetchrow(
            "SELECT account_url, encrypted_account_key FROM acme_accounts WHERE directory_url = $1",
            proxied.proxy.directory_url,
        )
        assert account is not None
        acme = _account_client(
            proxied,
            account["account_url"],
            proxied.encryption_key.decrypt(bytes(account["encrypted_account_key"])),
        )

        def read(url: str) -> dict[str, Any]:
            response = acme.net.post(url, None, new_nonce_url=acme.directory["newNonce"])
            body: dict[str, Any] = response.json()
            return body

        order = await asyncio.to_thread(read, order_url)
        [authz_url] = order["authorizations"]
        authz = await asyncio.to_thread(read, authz_url)
        assert authz["status"] == "deactivated", authz
        print(f"\ncancel while polling answered in {took:.1f} s; authorization {authz['status']}")

        description = await _wait_closed(client, hostname)
        assert description.status is WorkflowExecutionStatus.COMPLETED
    finally:
        proxied.pebble.clear_a(PROXIED_CNAME_TARGET)
        await blackhole.stop()


# --------------------------------------------------------------------------------- f. ARI


async def test_renewal_time_falls_in_the_ari_window(proxied: ProxiedDeployment) -> None:
    client, db = proxied.client, proxied.db
    proxy = proxied.proxy
    start, end = proxied.ari_window

    response = await asyncio.to_thread(
        requests.get, proxy.directory_url, verify=str(proxied.pebble.ca_bundle), timeout=10
    )
    assert response.json()["renewalInfo"] == proxy.renewal_info_url

    # The CA is briefly unavailable first: the worker must come back after Retry-After.
    proxy.inject(Endpoint.RENEWAL_INFO, Fault.unavailable(retry_after="1"))
    proxy.reset_counts()
    hostname = proxied.hostname("ari")
    await _issue(client, hostname)
    try:
        report = await _wait_for(
            client,
            hostname,
            lambda r: r.next_attempt_at is not None and start <= r.next_attempt_at <= end,
            timeout=120,  # the sweep (every second here), the 503, the signal: on 2 busy cores
            what="a renewal time inside the ARI window",
        )
    except AssertionError:
        print(proxied.worker_log_tail())
        raise
    assert report.status == "ACTIVE"
    assert "renewal time" in (report.phase or "")

    row = await _row(db, hostname)
    leaf = x509.load_pem_x509_certificate(row["ssl_certificate"].encode())
    one_third = renew_at(hostname, row["ssl_not_before"], row["ssl_expires_at"])
    assert not start <= one_third <= end  # so the window, not the 1/3 rule, decided
    assert proxy.count(Endpoint.RENEWAL_INFO) >= 2  # the 503, then the window
    assert proxy.pending(Endpoint.RENEWAL_INFO) == 0
    asked = proxy.renewal_info_requests()
    assert asked and set(asked) == {_ari_cert_id(leaf)}, asked
    print(
        f"\nARI window {start.isoformat()} .. {end.isoformat()}; renewal at "
        f"{report.next_attempt_at.isoformat() if report.next_attempt_at else None} "
        f"(the 1/3 rule would say {one_third.isoformat()})"
    )
