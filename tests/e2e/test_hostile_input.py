"""Hostile input: bad hostnames through the CLI, malformed requests at the responder.

``python starter.py request BAD`` must exit 2 with one clear line, write nothing
and start no workflow, for every entry of a corpus of bad hostnames (including
non-UTF-8 bytes in argv). The running worker's HTTP-01 responder must answer
malformed requests with 404/405 (or refuse malformed HTTP and close the
connection), serve an open challenge only to the right Host, and log no error
or traceback because of any of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import asyncpg
import idna
import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from certflow.contract import CERTIFICATE_WORKFLOW
from certflow.store import certificates
from certflow.hostnames import Hostname, InvalidHostnameError
from certflow.workflow_payloads import CertificateInput
from certflow.edge.responder import REQUEST_RECEIPT_SECONDS
from certflow.product.client import CertflowClient
from tests.e2e.conftest import (
    Deployment,
    plant_challenge,
    reconcile_schedule_paused,
    worker_log_after_sentinel,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

# (id, hostname as passed in argv: str, or bytes for non-UTF-8 argv)
BAD_HOSTNAMES: list[tuple[str, str | bytes]] = [
    # empty, dots and labels
    ("empty", ""),
    ("blank", "   "),
    ("dot", "."),
    ("dots", ".."),
    ("leading-dot", ".shop.example.com"),
    ("consecutive-dots", "shop..example.com"),
    ("two-trailing-dots", "shop.example.com.."),
    ("single-label", "com"),
    ("localhost", "localhost"),
    ("localhost-dot", "localhost."),
    ("localhost-upper", "LOCALHOST"),
    ("label-64", "a" * 64 + ".example.com"),
    ("name-259", ".".join(["a" * 63] * 4) + ".com"),
    ("leading-hyphen", "-shop.example.com"),
    ("trailing-hyphen", "shop-.example.com"),
    ("hyphens-3-4", "ab--cd.example.com"),
    ("numeric-tld", "shop.example.123"),
    # wildcards
    ("wildcard-twice", "*.*.example.com"),
    ("wildcard-under-a-public-suffix", "*.co.uk"),
    ("wildcard-bare", "*."),
    ("wildcard-inner", "shop.*.example.com"),
    ("wildcard-fullwidth", "\uff0a.\uff0a.example.com"),
    # IP literals
    ("ipv4", "127.0.0.1"),
    ("ipv4-dot", "10.0.0.1."),
    ("ipv4-hex", "0x7f.0.0.1"),
    ("ipv4-fullwidth", "\uff11\uff12\uff17.0.0.1"),
    ("ipv6", "::1"),
    ("ipv6-brackets", "[::1]"),
    ("ipv6-port", "[2001:db8::1]:443"),
    ("ipv6-mapped", "::ffff:127.0.0.1"),
    # invalid under IDNA 2008
    ("xn-empty", "xn--.example.com"),
    ("xn-bad-punycode", "xn--zz.example.com"),
    ("xn-control", "xn--a.example.com"),
    ("xn-emoji", "xn--ls8h.example.com"),
    ("emoji", "\U0001f4a9.example.com"),
    ("snowman-idna2003-only", "\u2603.example.com"),
    ("leading-combining-mark", "\u0301abc.example.com"),
    ("zwj-no-context", "ab\u200dc.example.com"),
    ("bidi-digit-then-arabic", "1\u0627.example.com"),
    ("rtl-override", "shop\u202e.example.com"),
    ("line-separator", "shop\u2028.example.com"),
    # control characters and whitespace
    ("space", "shop example.com"),
    ("tab", "shop\texample.com"),
    ("newline", "shop\nexample.com"),
    ("crlf-injection", "shop.example.com\r\nX-Injected: 1"),
    ("ansi-escape", "shop\x1b[31m.example.com"),
    ("del", "shop\x7f.example.com"),
    ("ctrl-a", "shop\x01.example.com"),
    # SQL, shell and URL metacharacters
    ("sql-drop", "shop'; DROP TABLE certificates; --.example.com"),
    ("sql-or", "x.example.com' OR '1'='1"),
    ("sql-comment", "shop.example.com'--"),
    ("shell-subst", "$(reboot).example.com"),
    ("shell-backtick", "`id`.example.com"),
    ("shell-semicolon", "shop.example.com;rm"),
    ("shell-pipe", "shop.example.com|cat"),
    ("shell-ampersand", "shop.example.com&&id"),
    ("path-traversal", "../../etc/passwd"),
    ("url", "https://shop.example.com/"),
    ("host-port", "shop.example.com:443"),
    ("userinfo", "user@shop.example.com"),
    ("percent", "shop%2eexample.com"),
    ("backslash", "shop.example.com\\"),
    ("query", "shop.example.com?x=1"),
    ("quotes", '"shop.example.com"'),
    ("html", "<script>alert(1)</script>.example.com"),
    ("template", "{{7*7}}.example.com"),
    ("jndi", "${jndi:ldap://x}.example.com"),
    ("underscore", "_acme-challenge.example.com"),
    # 10 kB strings
    ("10k-ascii", "x" * 10_240),
    ("10k-labels", "a." * 5_120 + "com"),
    ("10k-unicode", "\u00e9" * 10_240 + ".com"),
    ("10k-dots", "." * 10_240),
    # non-UTF-8 bytes in argv (decoded by Python with surrogateescape)
    ("latin1", b"caf\xe9.example.com"),
    ("invalid-start-bytes", b"\xff\xfe.example.com"),
    ("truncated-utf8", b"shop\xc3.example.com"),
    ("overlong-dot", b"shop\xc0\xae.example.com"),
    ("encoded-surrogate", b"\xed\xa0\x80.example.com"),
    ("10k-bytes", b"\xff" * 10_240),
]
assert len(BAD_HOSTNAMES) >= 50
assert len({name for name, _ in BAD_HOSTNAMES}) == len(BAD_HOSTNAMES)


def _client_env(deployment: Deployment) -> dict[str, str]:
    keep = ("CERTFLOW_DATABASE_URL", "CERTFLOW_TEMPORAL_ADDRESS", "CERTFLOW_TASK_QUEUE")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CERTFLOW_")}
    return {**clean, **{k: deployment.env[k] for k in keep}}


def _run_request(hostnames: list[str | bytes], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    # `--` where an argument starts with a hyphen, as a backend passing untrusted input must.
    needs_separator = any(
        (h.startswith(b"-") if isinstance(h, bytes) else h.startswith("-")) for h in hostnames
    )
    argv: list[str | bytes] = [sys.executable, "starter.py", "request"]
    argv += ["--"] if needs_separator else []
    argv += hostnames
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=120)


def _as_str(value: str | bytes) -> str:
    return os.fsdecode(value) if isinstance(value, bytes) else value


@pytest.fixture(scope="module")
async def reconcile_paused(client: CertflowClient) -> AsyncIterator[None]:
    """Held for the module: it plants rows by SQL."""
    async with reconcile_schedule_paused(client, "tests/e2e/test_hostile_input.py"):
        yield


def _could_have_written(values: list[str]) -> set[str]:
    """Every name the CLI could have written or started a workflow for, given these
    inputs: each as given and every normalised form (stripped, lower case, trailing dots
    dropped, NFKC, IDNA 2003/2008 A-labels) a hostname parser might produce."""
    forms = set(values)
    for form in list(forms):
        forms |= {form.strip(), form.lower(), form.strip().lower().rstrip(".")}
    for form in list(forms):
        forms.add(unicodedata.normalize("NFKC", form))
    for form in list(forms):
        for encode in (lambda f: idna.encode(f, uts46=True), lambda f: f.encode("idna")):
            try:
                forms.add(encode(form).decode("ascii").lower())
            except (UnicodeError, idna.IDNAError, ValueError):
                pass
    return forms


def _storable(names: set[str]) -> list[str]:
    """The names Postgres (UTF-8 text, no NUL) and Temporal (UTF-8 ids) could hold at all."""
    found = []
    for name in names:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            continue  # a lone surrogate from non-UTF-8 argv
        if "\x00" not in name:
            found.append(name)
    return sorted(found)


async def _my_rows_and_events(db: asyncpg.Pool, names: list[str]) -> tuple[list[str], int]:
    rows = await db.fetch(
        "SELECT hostname::text AS h FROM certificates WHERE hostname = ANY($1::citext[])", names
    )
    events = await db.fetchval(
        "SELECT count(*) FROM certificate_events WHERE hostname = ANY($1::citext[])", names
    )
    return sorted(r["h"] for r in rows), int(events)


async def _workflow_exists(client: CertflowClient, workflow_id: str) -> bool:
    try:
        await client.temporal.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            return False
        raise
    return True


async def _visibility_caught_up(client: CertflowClient, timeout: float = 30) -> None:
    """Start a marker workflow (a type no worker has, on a task queue nobody polls)
    and wait until visibility lists it: starts made before it are listed by then."""
    marker = f"hostile-input-visibility-marker-{uuid.uuid4().hex}"
    handle = await client.temporal.start_workflow(
        "HostileInputVisibilityMarker", id=marker, task_queue=f"nobody-polls-{uuid.uuid4().hex}"
    )
    try:
        deadline = time.monotonic() + timeout
        while not [w async for w in client.temporal.list_workflows(f"WorkflowId = '{marker}'")]:
            assert time.monotonic() < deadline, "visibility never listed the marker workflow"
            await asyncio.sleep(0.1)
    finally:
        await handle.terminate("visibility marker")


async def test_cli_rejects_every_bad_hostname_writing_nothing(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    """Each bad value exits 2 with one line, and nothing exists for it afterwards.

    Other tests' workflows keep working meanwhile (the deployment is shared), so this
    asserts only on what it could have written: rows, events and workflows for its own
    names (each value, its normalisations, the mixed request's good names), as deltas.
    Checked: a row for ``localhost`` (``LOCALHOST`` normalised) planted by SQL during
    the window made it fail (``rows written: ['localhost']``); removed."""
    env = _client_env(deployment)
    good = deployment.bare_hostname("hostile-good")
    mixed_names = [good, "bad..name.example.com", "also-" + good]
    mine = _storable(_could_have_written([_as_str(v) for _, v in BAD_HOSTNAMES] + mixed_names))
    my_ids = {f"certificate:{name}" for name in mine}
    rows_before, events_before = await _my_rows_and_events(db, mine)
    started = datetime.now(timezone.utc).replace(microsecond=0)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda item: _run_request([item[1]], env), BAD_HOSTNAMES))
    # One bad name among good ones: the good one is not written either.
    mixed = _run_request(list(mixed_names), env)

    failures = []
    for (name, value), result in [*zip(BAD_HOSTNAMES, results), (("mixed", "mixed"), mixed)]:
        err = result.stderr.decode("utf-8", "backslashreplace")
        lines = err.splitlines()
        problems = []
        if result.returncode != 2:
            problems.append(f"exit {result.returncode}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} lines on stderr")
        elif not lines[0].startswith("certflow: invalid hostname "):
            problems.append("message does not say 'invalid hostname'")
        elif len(lines[0]) > 1000 or not lines[0].isprintable():
            problems.append("message is not short and printable")
        if result.stdout:
            problems.append(f"stdout: {result.stdout[:100]!r}")
        if problems:
            failures.append(f"{name}: {', '.join(problems)}; stderr: {err[-400:]!r}")
    assert not failures, "\n".join(failures)

    # Nothing written, nothing started, for any of this test's names.
    rows_after, events_after = await _my_rows_and_events(db, mine)
    assert rows_after == rows_before, f"rows written: {sorted(set(rows_after) - set(rows_before))[:10]}"
    assert events_after == events_before, f"{events_after - events_before} events for the bad names"
    started_ids = [i for i in sorted(my_ids) if len(i) < 1000 and await _workflow_exists(client, i)]
    assert not started_ids, f"workflows exist: {started_ids[:10]}"
    # And as visibility lists them (ids too long for a describe included).
    await _visibility_caught_up(client)
    query = (
        "WorkflowType = 'Certificate' AND "
        f"StartTime >= '{started.isoformat().replace('+00:00', 'Z')}'"
    )
    listed = {e.id async for e in client.temporal.list_workflows(query)}
    assert not listed & my_ids, f"workflows started: {sorted(listed & my_ids)[:10]}"


BAD_TENANTS: list[tuple[str, str]] = [
    ("empty", ""),
    ("blank", "   "),
    # (A NUL cannot reach a process through argv; the library refuses it:
    # tests/unit/test_hostnames.py.)
    ("newline", "tenant\nINFO forged log line"),
    ("escape", "tenant\x1b[31m"),
    ("line-separator", "tenant\u2028x"),
    ("over-long", "t" * 201),
]


async def test_cli_rejects_bad_tenants_for_request_and_transfer_writing_nothing(
    deployment: Deployment, db: asyncpg.Pool
) -> None:
    """``request --tenant`` and ``transfer --to`` with each bad tenant id: exit 2, one
    line saying "invalid tenant", nothing written for the request's hostname (its
    row, its events) and no workflow touched."""
    env = _client_env(deployment)
    hostname = deployment.bare_hostname("hostile-tenant")
    failures = []
    for name, tenant in BAD_TENANTS:
        for argv in (
            ["request", hostname, "--tenant", tenant],
            ["transfer", hostname, "--to", tenant],
        ):
            result = subprocess.run(
                [sys.executable, "starter.py", *argv], cwd=ROOT, env=env, capture_output=True, timeout=120
            )
            lines = result.stderr.decode("utf-8", "backslashreplace").splitlines()
            if result.returncode != 2 or len(lines) != 1 or not lines[0].startswith("certflow: invalid tenant "):
                failures.append(f"{argv[0]} {name}: exit {result.returncode}, stderr {lines[:3]!r}")
            elif not lines[0].isprintable():
                failures.append(f"{argv[0]} {name}: the message is not printable")
    assert not failures, "\n".join(failures)
    assert await db.fetchval("SELECT count(*) FROM certificates WHERE hostname = $1", hostname) == 0
    assert await db.fetchval("SELECT count(*) FROM certificate_events WHERE hostname = $1", hostname) == 0


def test_cli_exits_cleanly_after_rejecting(deployment: Deployment) -> None:
    """Exit code 2 every time, never an interpreter abort (BUG-3, fixed in 2e9b65c: the
    CLI now refuses bad hostnames before connecting; the abort used to come within a few
    dozen runs, 4 at a time). 100 runs."""
    env = _client_env(deployment)
    argv = [sys.executable, "starter.py", "request", "bad..name.example.com"]

    def once(_: int) -> tuple[int, str]:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=120)
        return done.returncode, done.stderr.decode(errors="replace")

    with ThreadPoolExecutor(max_workers=4) as pool:
        for start in range(0, 100, 20):
            for code, err in pool.map(once, range(start, start + 20)):
                assert code == 2, f"run {start}+: exit {code}\n{err}"


async def test_library_rejects_the_same_corpus_and_more(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    """The same corpus through CertflowClient.request, plus what argv cannot carry
    (NUL) and values that are not strings at all. Rows are compared for this test's
    own names only (each value and its normalisations), as in the CLI test."""
    corpus: list[object] = [_as_str(v) for _, v in BAD_HOSTNAMES]
    corpus += ["shop.example.com\x00", "\x00", "shop\x00.example.com", b"shop.example.com", None, 42]
    good = deployment.bare_hostname("lib-good")
    mine = _storable(_could_have_written([v for v in corpus if isinstance(v, str)] + [good]))
    before = await _my_rows_and_events(db, mine)
    for value in corpus:
        with pytest.raises(InvalidHostnameError) as caught:
            await client.request([value])  # type: ignore[list-item]
        message = str(caught.value)
        assert "\n" not in message and len(message) < 1000 and message.isprintable(), repr(message)
    with pytest.raises(InvalidHostnameError):
        await client.request([good, "bad..name.example.com"])
    assert await _my_rows_and_events(db, mine) == before


async def test_a_workflow_started_directly_with_a_bad_hostname_writes_nothing(
    deployment: Deployment, client: CertflowClient, db: asyncpg.Pool
) -> None:
    """A backend that starts the Certificate workflow itself, past the client, with a
    hostname that is not valid, or valid but not in its canonical spelling (the
    row and the workflow id would then differ from the ones ``request`` makes),
    gets a failed workflow whose cause is InvalidHostnameError naming the problem,
    and no row: ``ensure_certificate``, the first step, checks it before writing.

    Shown red: with the refusal taken out of ``ensure_certificate`` the first
    workflow ran on (the 60 s wait for its failure timed out)."""
    canonical = deployment.bare_hostname("direct-start")
    # Names of this test's own: the CLI test asserts no workflow for its corpus's.
    cases = {
        f"bad..{canonical}": "empty label",
        canonical.upper(): f"not in canonical form: request {canonical}",
    }
    before = await _my_rows_and_events(db, [canonical, *cases])
    for raw, reason in cases.items():
        handle = await client.temporal.start_workflow(
            CERTIFICATE_WORKFLOW,
            CertificateInput(hostname=Hostname(raw)),
            id=f"certificate:{raw}",
            task_queue=client.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(handle.result(), timeout=60)
        refusal = caught.value.cause.__cause__
        assert isinstance(refusal, ApplicationError), repr(caught.value.cause)
        assert refusal.type == "InvalidHostnameError" and reason in refusal.message, refusal.message
    assert await _my_rows_and_events(db, [canonical, *cases]) == before == ([], 0)


# ---------------------------------------------------------------------------- responder


@dataclass(frozen=True)
class Planted:
    hostname: str
    token: str
    key_authorization: str


@pytest.fixture(scope="module")
async def planted(
    deployment: Deployment, db: asyncpg.Pool, reconcile_paused: None
) -> AsyncIterator[Planted]:
    """An open challenge no workflow handles (so nothing else touches it)."""
    hostname = deployment.bare_hostname("hostile-responder")
    certificate_id, order = await plant_challenge(db, hostname)
    try:
        yield Planted(hostname, order.token, order.key_authorization)
    finally:
        await certificates.delete(db, certificate_id)


def _exchange(port: int, data: bytes, *, read_timeout: float = 5.0) -> tuple[bytes, bool]:
    """Send raw bytes, read what comes back until the server closes the connection (or
    read_timeout passes). Returns (response, closed by the server).

    No half-close: uvicorn drops the answer to a request still in progress when the
    client shuts down its sending side, which no real HTTP client does."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return b"", True  # the server hung up while we were still sending
        sock.settimeout(read_timeout)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            return received, True
        except TimeoutError:
            return received, False
        return received, True


def _pipeline(port: int, data: bytes, responses: int) -> bytes:
    """Send many requests at once on one keep-alive connection; read all the answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        deadline = time.monotonic() + 30
        while len(_statuses(received)) < responses and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


_STATUS_LINE = re.compile(rb"(?:^|\n)HTTP/1\.[01] (\d{3}) ")


def _statuses(response: bytes) -> list[int]:
    """The status codes of the responses in order (bodies here never contain one)."""
    return [int(code) for code in _STATUS_LINE.findall(response)]


def _get(target: str | bytes, host: str | bytes | None, *, method: bytes = b"GET",
         extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    target = target.encode() if isinstance(target, str) else target
    host_line = b"" if host is None else b"Host: " + (host.encode() if isinstance(host, str) else host) + b"\r\n"
    return method + b" " + target + b" " + version + b"\r\n" + host_line + extra + b"Connection: close\r\n\r\n"


def _responder_cases(p: Planted) -> Iterator[tuple[str, bytes, str]]:
    """(name, raw request, expectation): '200' the key authorization ('200-head': its
    headers only), '404', '405', or 'refused' (malformed HTTP: only 4xx answers, e.g.
    uvicorn's 400, and the connection closed, or closed without an answer); '|'
    separates acceptable outcomes. The key authorization is never in a non-200."""
    path = f"/.well-known/acme-challenge/{p.token}"
    yield "control: right host", _get(path, p.hostname), "200"
    yield "control: host upper case with port", _get(path, p.hostname.upper() + ":80"), "200"
    yield "control: HEAD", _get(path, p.hostname, method=b"HEAD"), "200-head"
    # wrong Host
    yield "wrong host", _get(path, "other.example.com"), "404"
    yield "host is a parent", _get(path, p.hostname.split(".", 1)[1]), "404"
    yield "host with suffix", _get(path, p.hostname + ".evil.com"), "404"
    yield "host ip", _get(path, "127.0.0.1"), "404"
    yield "host ipv6", _get(path, "[::1]:80"), "404"
    yield "host empty", _get(path, ""), "404"
    yield "no host (HTTP/1.0)", _get(path, None, version=b"HTTP/1.0"), "404"
    yield "host with latin-1 byte", _get(path, p.hostname.encode() + b"\xff"), "404"
    yield "host with NUL", _get(path, p.hostname.encode() + b"\x00"), "refused"
    yield "two hosts, first wrong", _get(path, "other.example.com", extra=b"Host: " + p.hostname.encode() + b"\r\n"), "404|refused"
    yield "absolute-form target, wrong host", _get(f"http://other.example.com{path}", "other.example.com"), "404"
    # path traversal and other paths
    for target in (
        "/.well-known/acme-challenge/../../etc/passwd",
        "/.well-known/acme-challenge/..%2f..%2fetc%2fpasswd",
        "/.well-known/acme-challenge/%2e%2e/%2e%2e/etc/passwd",
        f"/.well-known/acme-challenge/{p.token}/../{p.token}x",
        f"/.well-known/acme-challenge/{p.token}%00",
        f"/.well-known/acme-challenge/{p.token}/",
        f"/.well-known/acme-challenge//{p.token}",
        f"/.well-known/acme-challenge/{p.token[:-1]}",
        "/.well-known/acme-challenge/",
        "/.well-known/acme-challenge/%ff%fe",
        "/etc/passwd",
        "//etc/passwd",
        "/",
        "*",
    ):
        yield f"path {target[:50]!r}", _get(target, p.hostname), "404"
    yield "raw UTF-8 in path", _get("/.well-known/acme-challenge/\u00e9t\u00e9".encode(), p.hostname), "404|refused"
    # huge tokens
    yield "token 129 chars", _get("/.well-known/acme-challenge/" + "A" * 129, p.hostname), "404"
    yield "token 8 kB", _get("/.well-known/acme-challenge/" + "A" * 8_000, p.hostname), "404|refused"
    yield "token 100 kB", _get("/.well-known/acme-challenge/" + "A" * 100_000, p.hostname), "404|refused"
    # methods
    for method in (b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"PROPFIND"):
        yield f"method {method.decode()}", _get(path, p.hostname, method=method, extra=b"Content-Length: 0\r\n"), "405"
    yield "method CONNECT", _get(f"{p.hostname}:80", p.hostname, method=b"CONNECT"), "404|refused"
    yield "method with NUL", _get(path, p.hostname, method=b"GE\x00T"), "refused"
    yield "lower-case method", _get(path, p.hostname, method=b"get"), "405|refused"
    # malformed HTTP and garbage
    # Garbage that ends like a request head (else the receipt deadline closes it: BUG-4).
    yield "random bytes", secrets.token_bytes(4096) + b"\r\n\r\n", "refused"
    yield "nul bytes", b"\x00" * 1024, "refused"
    yield "tls client hello", bytes.fromhex("16030100a5010000a10303") + secrets.token_bytes(160), "refused"
    yield "http/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + secrets.token_bytes(64), "404|refused"
    yield "http/0.9", f"GET {path}\r\n\r\n".encode(), "refused"
    # Well-formed apart from an odd version or size: serving the (public) key
    # authorization to the right Host is fine, so is refusing.
    yield "unknown version", _get(path, p.hostname, version=b"HTTP/9.9"), "200|refused"
    yield "header without colon", _get(path, p.hostname, extra=b"this is not a header\r\n"), "refused"
    yield "header 100 kB", _get(path, p.hostname, extra=b"X-Big: " + b"a" * 100_000 + b"\r\n"), "200|refused"
    yield "1000 headers", _get(path, p.hostname, extra=b"".join(b"X-H%d: v\r\n" % i for i in range(1000))), "404|200|refused"
    yield "bad content-length", _get(path, p.hostname, method=b"POST", extra=b"Content-Length: -1\r\n"), "refused"
    yield "content-length and chunked", _get(path, p.hostname, method=b"POST", extra=b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n") + b"zzzz", "405|refused"
    yield "body shorter than content-length + garbage", _get(path, p.hostname, method=b"POST", extra=b"Content-Length: 2\r\n") + b"abGARBAGE\r\n\r\n", "405|refused"
    # A malformed chunked body: see test_malformed_bodies_log_no_errors (BUG-5, fixed).
    # Requests cut off half-way: see test_responder_closes_stalled_connections (BUG-4, fixed).
    yield "only CRLFs", b"\r\n" * 1000, "refused"


def _meets(expectation: str, response: bytes, closed: bool, p: Planted) -> bool:
    statuses = _statuses(response)
    key_authorization = p.key_authorization.encode()
    for option in expectation.split("|"):
        if option == "refused":
            if closed and all(400 <= s < 500 for s in statuses) and key_authorization not in response:
                return True
        elif option == "200":
            if statuses == [200] and response.endswith(b"\r\n\r\n" + key_authorization):
                return True
        elif option == "200-head":
            if statuses == [200] and response.endswith(b"\r\n\r\n"):
                return b"content-length: %d" % len(key_authorization) in response.lower()
        elif statuses == [int(option)] and key_authorization not in response:
            return True
    return False


def _log_problems(new_log: bytes) -> list[str]:
    """Error-level lines and tracebacks in the worker log that the responder caused."""
    problems = []
    for raw in new_log.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            if b"Traceback" in raw or b"ERROR" in raw:
                problems.append(raw.decode(errors="replace")[:300])
            continue
        text = json.dumps(entry)
        responder_related = str(entry.get("logger", "")).startswith(("uvicorn", "certflow.edge.responder")) or any(
            marker in text for marker in ("responder.py", "uvicorn", "h11", "ASGI")
        )
        if not responder_related:
            continue
        if entry.get("level") in ("error", "critical") or "exception" in entry or "Traceback" in text:
            problems.append(text[:300])
    return problems


async def test_responder_shrugs_off_malformed_requests(deployment: Deployment, planted: Planted) -> None:
    port = deployment.pebble.http01_port
    log_offset = deployment.worker.log.stat().st_size
    cases = list(_responder_cases(planted))
    results = []
    for name, data, expectation in cases:
        response, closed = await asyncio.to_thread(_exchange, port, data)
        results.append((name, expectation, response, closed))
    # Many at once on one connection (pipelined), and the responder still answers after.
    pipelined = b"".join(
        _get(f"/.well-known/acme-challenge/{secrets.token_urlsafe(32)}", planted.hostname).replace(
            b"Connection: close\r\n", b""
        )
        for _ in range(200)
    )
    response = await asyncio.to_thread(_pipeline, port, pipelined, 200)
    assert _statuses(response) == [404] * 200

    failures = [
        f"{name}: expected {expectation}, got {_statuses(response)} closed={closed} {response[:120]!r}"
        for name, expectation, response, closed in results
        if not _meets(expectation, response, closed, planted)
    ]
    assert not failures, "\n".join(failures)

    response, _ = await asyncio.to_thread(
        _exchange, port, _get(f"/.well-known/acme-challenge/{planted.token}", planted.hostname)
    )
    assert _statuses(response) == [200] and response.endswith(planted.key_authorization.encode())

    new_log = await worker_log_after_sentinel(deployment.worker, log_offset)
    problems = _log_problems(new_log)
    assert not problems, "the responder logged errors:\n" + "\n".join(problems[:20])


# BUG-4 (fixed): uvicorn has no request-receipt timeout (timeout_keep_alive only runs
# between requests), so a slowloris client held the worker's sockets for ever; the
# responder's protocol now closes a request not received whole in
# REQUEST_RECEIPT_SECONDS (certflow/edge/responder.py _GuardedH11Protocol).
STALL_LIMIT_S = REQUEST_RECEIPT_SECONDS + 5.0


def test_responder_closes_stalled_connections(deployment: Deployment, planted: Planted) -> None:
    port = deployment.pebble.http01_port
    stalls = {
        "nothing sent": b"",
        "cut-off request line": b"GET /.well-known/acme-challenge/",
        "cut-off headers": (
            f"GET /.well-known/acme-challenge/{planted.token} HTTP/1.1\r\n"
            f"Host: {planted.hostname}\r\n"
        ).encode(),
        "cut-off body": (
            f"POST /.well-known/acme-challenge/{planted.token} HTTP/1.1\r\n"
            f"Host: {planted.hostname}\r\nContent-Length: 100\r\n\r\nabc"
        ).encode(),
    }
    sockets = {}
    for name, data in stalls.items():
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(data)
        sockets[name] = sock
    deadline = time.monotonic() + STALL_LIMIT_S
    still_open = []
    try:
        for name, sock in sockets.items():
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while sock.recv(65536):
                    pass  # e.g. a 405 for the cut-off body, then the close
            except TimeoutError:
                still_open.append(name)
            except ConnectionResetError:
                pass
    finally:
        for sock in sockets.values():
            sock.close()
    assert not still_open, f"still open after {STALL_LIMIT_S:.0f}s: {still_open}"


# BUG-5 (fixed): a request with valid headers and a malformed chunked body logged
# 'Exception in ASGI application' with a traceback every time: uvicorn answers 400
# itself, then the responder's own 404/405 failed inside h11.


async def test_malformed_bodies_log_no_errors(deployment: Deployment, planted: Planted) -> None:
    port = deployment.pebble.http01_port
    path = f"/.well-known/acme-challenge/{planted.token}"
    bad_chunk = b"Transfer-Encoding: chunked\r\n"
    requests = [
        _get(path, planted.hostname, method=b"POST", extra=bad_chunk) + b"zz\r\nxx\r\n",  # 405 path
        _get(path, "Bad_Host", extra=bad_chunk) + b"zz\r\nxx\r\n",  # 404 without a lookup
    ]
    log_offset = deployment.worker.log.stat().st_size
    for data in requests * 3:
        response, closed = await asyncio.to_thread(_exchange, port, data)
        assert closed and _statuses(response) in ([400], [404], [405]), response[:200]
    problems = _log_problems(await worker_log_after_sentinel(deployment.worker, log_offset))
    assert not problems, f"{len(problems)} error lines, e.g.:\n" + "\n".join(problems[:2])
