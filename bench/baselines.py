"""Bare ``acme`` baselines: what a developer writes without durability.

One ``ClientV2`` per thread, the account registered once, an EC P-256 key and
CSR per certificate, the http-01 key authorization served from an in-memory
dict by a tiny HTTP server on Pebble's HTTP-01 port.

- ``plain``: the library's own helpers: ``new_order``, ``answer_challenge``,
  ``poll_and_finalize`` (which sleeps 1 s between polls).
- ``floor``: the same, but polls the order every 20 ms with single POST-as-GET
  calls, then finalizes, polls and downloads itself.
"""

from __future__ import annotations

import datetime
import http.server
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acme import challenges, client as acme_client, crypto_util, messages
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from josepy.jwa import ES256
from josepy.jwk import JWKEC

from bench.stats import summary

FLOOR_POLL_SECONDS = 0.02
CHALLENGE_PREFIX = "/.well-known/acme-challenge/"


class ChallengeServer:
    """Serves key authorizations from a dict on 127.0.0.1:port (any Host)."""

    def __init__(self, port: int) -> None:
        self.answers: dict[str, str] = {}
        answers = self.answers

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                token = self.path.removeprefix(CHALLENGE_PREFIX)
                body = answers.get(token) if self.path.startswith(CHALLENGE_PREFIX) else None
                payload = (body or "not found\n").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        http.server.ThreadingHTTPServer.daemon_threads = True
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ChallengeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass(frozen=True)
class Account:
    directory_url: str
    key: JWKEC
    registration: messages.RegistrationResource
    verify: str


def _network(key: JWKEC, verify: str) -> acme_client.ClientNetwork:
    # requests takes a CA bundle path where acme's signature says bool.
    return acme_client.ClientNetwork(key, alg=ES256, verify_ssl=verify, user_agent="bench")  # type: ignore[arg-type]


def register_account(directory_url: str, ca_bundle: Path) -> Account:
    key = JWKEC(key=ec.generate_private_key(ec.SECP256R1()))
    net = _network(key, str(ca_bundle))
    client = acme_client.ClientV2(acme_client.ClientV2.get_directory(directory_url, net), net)
    registration = client.new_account(
        messages.NewRegistration.from_data(terms_of_service_agreed=True)
    )
    return Account(directory_url, key, registration, str(ca_bundle))


def new_client(account: Account) -> acme_client.ClientV2:
    net = _network(account.key, account.verify)
    net.account = account.registration
    return acme_client.ClientV2(acme_client.ClientV2.get_directory(account.directory_url, net), net)


def _key_and_csr(hostname: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    csr: bytes = crypto_util.make_csr(pem, [hostname])
    return csr


def _open_order(
    client: acme_client.ClientV2, hostname: str, answers: dict[str, str]
) -> tuple[messages.OrderResource, str]:
    """New order, key authorization stored, challenge answered; returns (order, token)."""
    orderr = client.new_order(_key_and_csr(hostname))
    challb = next(
        c for c in orderr.authorizations[0].body.challenges if isinstance(c.chall, challenges.HTTP01)
    )
    response, validation = challb.response_and_validation(client.net.key)
    token = challb.chall.encode("token")
    answers[token] = validation
    client.answer_challenge(challb, response)
    return orderr, token


def issue_plain(client: acme_client.ClientV2, hostname: str, answers: dict[str, str]) -> str:
    orderr, token = _open_order(client, hostname, answers)
    try:
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=90)  # naive, as acme wants
        done = client.poll_and_finalize(orderr, deadline)
    finally:
        answers.pop(token, None)
    return str(done.fullchain_pem)


def _get(client: acme_client.ClientV2, url: str) -> Any:
    """One POST-as-GET."""
    return client.net.post(url, None, new_nonce_url=client.directory["newNonce"])


def _poll_order(client: acme_client.ClientV2, url: str, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    while True:
        body: dict[str, Any] = _get(client, url).json()
        if until(body):
            return body
        if body.get("status") == "invalid" or time.monotonic() > deadline:
            raise RuntimeError(f"order {url} is {body.get('status')}: {body.get('error')}")
        time.sleep(FLOOR_POLL_SECONDS)


def issue_floor(client: acme_client.ClientV2, hostname: str, answers: dict[str, str]) -> str:
    orderr, token = _open_order(client, hostname, answers)
    try:
        order = _poll_order(client, orderr.uri, lambda o: o.get("status") in ("ready", "valid"))
    finally:
        answers.pop(token, None)
    csr = messages.CertificateRequest(csr=x509.load_pem_x509_csr(orderr.csr_pem))
    client.net.post(order["finalize"], csr, new_nonce_url=client.directory["newNonce"])
    order = _poll_order(
        client, orderr.uri, lambda o: o.get("status") == "valid" and bool(o.get("certificate"))
    )
    return str(_get(client, order["certificate"]).text)


MODES: dict[str, Callable[[acme_client.ClientV2, str, dict[str, str]], str]] = {
    "plain": issue_plain,
    "floor": issue_floor,
}


@dataclass
class Trial:
    mode: str
    threads: int
    completed: int
    errors: int
    wall_seconds: float
    latencies: list[float] = field(repr=False)
    first_error: str | None = None

    @property
    def throughput(self) -> float:
        return self.completed / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "completed": self.completed,
            "errors": self.errors,
            "first_error": self.first_error,
            "wall_seconds": round(self.wall_seconds, 3),
            "certs_per_second": round(self.throughput, 3),
            "seconds_per_cert": {k: _round(v) for k, v in summary(self.latencies).items()},
        }


def _round(value: float | int | None) -> float | int | None:
    return round(value, 4) if isinstance(value, float) else value


def run_trial(mode: str, account: Account, threads: int, seconds: float, answers: dict[str, str]) -> Trial:
    """``threads`` threads, each with its own client, issue certificates one after
    another until ``seconds`` have passed (no new one starts after that)."""
    issue = MODES[mode]
    clients = [new_client(account) for _ in range(threads)]
    run_id = uuid.uuid4().hex[:6]
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    finished: list[float] = []
    start = time.monotonic()
    stop_at = start + seconds

    def loop(index: int, client: acme_client.ClientV2) -> None:
        count = 0
        while time.monotonic() < stop_at:
            hostname = f"{mode}-{run_id}-t{index}-{count}.bench.test"
            count += 1
            began = time.monotonic()
            try:
                issue(client, hostname, answers)
            except Exception as exc:  # counted, reported
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            ended = time.monotonic()
            with lock:
                latencies.append(ended - began)
                finished.append(ended)

    workers = [threading.Thread(target=loop, args=(i, c)) for i, c in enumerate(clients)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    wall = (max(finished) if finished else time.monotonic()) - start
    return Trial(mode, threads, len(latencies), len(errors), wall, latencies, errors[0] if errors else None)


def sweep(
    mode: str,
    account: Account,
    thread_counts: list[int],
    seconds: float,
    answers: dict[str, str],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """A trial per thread count; the best throughput and the 1-thread latency."""
    trials = []
    for threads in thread_counts:
        trial = run_trial(mode, account, threads, seconds, answers)
        p50 = summary(trial.latencies)["p50"]
        log(
            f"  {mode:5} threads={threads:3}: {trial.completed:4} certs in {trial.wall_seconds:6.2f} s"
            f" = {trial.throughput:6.2f}/s, p50 {p50 if p50 is None else round(p50, 3)} s,"
            f" errors {trial.errors}"
        )
        trials.append(trial)
    best = max(trials, key=lambda t: t.throughput)
    single = next((t for t in trials if t.threads == 1), None)
    return {
        "mode": mode,
        "best": best.to_json(),
        "single_thread": single.to_json() if single else None,
        "trials": [t.to_json() for t in trials],
    }
