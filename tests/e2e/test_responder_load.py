"""A bounded load test of the worker's HTTP-01 responder, from a second process.

200 concurrent keep-alive connections on loopback for ``CERTFLOW_LOAD_SECONDS``
(default 15) send a mix of valid challenge requests (open challenges planted in
the session deployment's database for hostnames no workflow handles, asked
with the right Host) and misses (unknown tokens, wrong hosts, other paths).
Every answer must be 200 with the key authorization for a valid request and 404
for a miss, with no connection error, and none may go unanswered for 10 s (a
CA's validation would fail: p99 was 66 ms here, so a timeout is the responder
stalling, not a slow machine). Throughput and latency are printed, not
asserted: on a loaded 2-core machine they measure the machine. Meanwhile the deployment keeps issuing: two
certificates requested once the load is on must become ACTIVE (the CA's own
validation requests compete with the load), under a generous deadline; whether
that happened before the load ended is printed.

The load comes from ``wrk`` when it is installed (a Lua script checks every
answer), otherwise from the asyncio generator at the bottom of this file, run as
``python -m tests.e2e.test_responder_load --generate SPEC.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LOAD_SECONDS = float(os.environ.get("CERTFLOW_LOAD_SECONDS", "15"))
CONCURRENCY = 200
REQUEST_TIMEOUT_S = 10.0
NOT_FOUND_BODY = "not found\n"


# ------------------------------------------------------------------ the load generator
# Only the standard library here: this part runs in the second process.


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return status, await reader.readexactly(length)


async def _connection(
    port: int,
    targets: list[dict[str, Any]],
    start: int,
    deadline: float,
    latencies: list[float],
    counts: dict[str, int],
    errors: list[str],
    wrong: list[str],
) -> None:
    index = start
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    while time.monotonic() < deadline:
        target = targets[index % len(targets)]
        index += 1
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), REQUEST_TIMEOUT_S
                )
            assert reader is not None and writer is not None
            sent = time.perf_counter()
            writer.write(target["request"].encode("latin-1"))
            status, body = await asyncio.wait_for(_read_response(reader), REQUEST_TIMEOUT_S)
            latencies.append(time.perf_counter() - sent)
        except TimeoutError:
            counts["timeouts"] += 1  # no answer in REQUEST_TIMEOUT_S: asserted none
            if writer is not None:
                writer.close()
            writer = reader = None
            continue
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError, IndexError) as err:
            errors.append(f"{target['kind']}: {type(err).__name__}: {err}")
            if writer is not None:
                writer.close()
            writer = reader = None
            continue
        good = status == target["status"] and body.decode("latin-1") == target["body"]
        counts[f"{target['kind']} {'ok' if good else 'wrong'}"] += 1
        if not good and len(wrong) < 1000:
            wrong.append(f"{target['kind']}: got {status} {body[:80]!r}, expected {target['status']}")
    if writer is not None:
        writer.close()


async def _generate(spec: dict[str, Any]) -> dict[str, Any]:
    targets: list[dict[str, Any]] = spec["targets"]
    deadline = time.monotonic() + spec["seconds"]
    latencies: list[float] = []
    counts: dict[str, int] = {
        f"{kind} {verdict}": 0 for kind in ("valid", "miss") for verdict in ("ok", "wrong")
    }
    counts["timeouts"] = 0
    errors: list[str] = []
    wrong: list[str] = []
    started = time.monotonic()
    await asyncio.gather(
        *(
            _connection(spec["port"], targets, i * 7, deadline, latencies, counts, errors, wrong)
            for i in range(spec["concurrency"])
        )
    )
    elapsed = time.monotonic() - started
    latencies.sort()

    def percentile(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    return {
        "tool": "asyncio",
        "requests": len(latencies),
        "seconds": round(elapsed, 2),
        "throughput": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(0.50), 2),
        "p99_ms": round(percentile(0.99), 2),
        "max_ms": round(latencies[-1] * 1000, 2) if latencies else 0.0,
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2) if latencies else 0.0,
        "counts": {k: v for k, v in counts.items() if k != "timeouts"},
        "timeouts": counts["timeouts"],
        "errors": len(errors),
        "error_samples": (errors + wrong)[:10],
    }


_WRK_SCRIPT = r"""
-- Targets alternate valid/miss per thread; every answer is checked by status and body.
local targets = {}
local valid_bodies = {}
local threads = {}
local counter = 0
__TARGETS__
function setup(thread)
  thread:set("offset", #threads * 7)
  table.insert(threads, thread)
end
function init(args)
  ok_valid, ok_miss, wrong, issued_valid, issued_miss = 0, 0, 0, 0, 0
  counter = offset
end
function request()
  counter = counter + 1
  local t = targets[(counter % #targets) + 1]
  if t.kind == "valid" then issued_valid = issued_valid + 1 else issued_miss = issued_miss + 1 end
  return wrk.format("GET", t.path, { ["Host"] = t.host })
end
function response(status, headers, body)
  if status == 200 and valid_bodies[body] then ok_valid = ok_valid + 1
  elseif status == 404 and body == "not found\n" then ok_miss = ok_miss + 1
  else wrong = wrong + 1 end
end
function done(summary, latency, requests)
  local t = { ok_valid = 0, ok_miss = 0, wrong = 0, issued_valid = 0, issued_miss = 0 }
  for _, thread in ipairs(threads) do
    for k, _ in pairs(t) do t[k] = t[k] + thread:get(k) end
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "max_us": %d,'
    .. ' "mean_us": %d, "ok_valid": %d, "ok_miss": %d, "wrong": %d, "issued_valid": %d,'
    .. ' "issued_miss": %d, "connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, latency.mean, t.ok_valid, t.ok_miss, t.wrong, t.issued_valid, t.issued_miss,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def _run_wrk(wrk: str, spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    def lua(text: str) -> str:
        return json.dumps(text)  # a JSON string literal is a valid Lua string here (ASCII)

    lines = []
    for target in spec["targets"]:
        lines.append(
            f'table.insert(targets, {{kind = {lua(target["kind"])}, path = {lua(target["path"])},'
            f' host = {lua(target["host"])}}})'
        )
        if target["kind"] == "valid":
            lines.append(f'valid_bodies[{lua(target["body"])}] = true')
    script = workdir / "responder-load.lua"
    script.write_text(_WRK_SCRIPT.replace("__TARGETS__", "\n".join(lines)))
    done = subprocess.run(
        [wrk, "-t", "2", "-c", str(spec["concurrency"]), "-d", f"{spec['seconds']:g}s",
         "--timeout", f"{REQUEST_TIMEOUT_S:g}s", "-s", str(script), f"http://127.0.0.1:{spec['port']}/"],
        capture_output=True, text=True, timeout=spec["seconds"] + 120,
    )
    line = next((l for l in done.stdout.splitlines() if l.startswith("WRKJSON ")), None)
    assert done.returncode == 0 and line, f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}"
    raw = json.loads(line.removeprefix("WRKJSON "))
    seconds = raw["duration_us"] / 1e6
    socket_errors = sum(raw[k] for k in ("connect", "read", "write"))
    return {
        "tool": "wrk",
        "requests": raw["requests"],
        "seconds": round(seconds, 2),
        "throughput": round(raw["requests"] / seconds, 1),
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "mean_ms": round(raw["mean_us"] / 1000, 2),
        "counts": {
            "valid ok": raw["ok_valid"],
            "miss ok": raw["ok_miss"],
            # wrk cannot pair an answer with its request: a valid request answered
            # 404 would count as a miss, so compare what was sent with what came back
            # (less the requests still open at the end and those that timed out).
            "valid wrong": max(
                0, raw["issued_valid"] - raw["ok_valid"] - spec["concurrency"] - raw["timeout"]
            ),
            "miss wrong": raw["wrong"],
        },
        "timeouts": raw["timeout"],
        "errors": socket_errors,
        "error_samples": [wrk_line for wrk_line in done.stdout.splitlines() if "error" in wrk_line.lower()],
    }


def _main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "--generate":
        print("usage: python -m tests.e2e.test_responder_load --generate SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[2]).read_text())
    print(json.dumps(asyncio.run(_generate(spec))))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))


# --------------------------------------------------------------------------- the test

import asyncpg  # noqa: E402 (the generator above must not need these)
import pytest  # noqa: E402

from certflow.store import certificates  # noqa: E402
from certflow.product.client import CertflowClient  # noqa: E402
from tests.e2e.conftest import (  # noqa: E402
    Deployment,
    plant_challenge,
    reconcile_schedule_paused,
    worker_log_after_sentinel,
)

pytestmark = pytest.mark.e2e

PLANTED = 4
# Generous: the point is that issuance goes on under the load, not how fast.
ISSUANCE_DEADLINE_S = LOAD_SECONDS + 240


def _established_to(port: int) -> int:
    """TCP connections in ESTABLISHED state whose local port is ``port`` (the
    responder's side of each), from the kernel's tables (Linux)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def _request_bytes(path: str, host: str) -> str:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: certflow-load\r\n\r\n"


def _targets(planted: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """An even mix of valid requests and misses (each miss kind once per round)."""
    prefix = "/.well-known/acme-challenge/"
    valid, misses = [], []
    for index, (host, token, key_authorization) in enumerate(planted):
        other_host = planted[(index + 1) % len(planted)][0]
        for asked_host in (host, host.upper() + ":80"):
            valid.append(("valid", prefix + token, asked_host, 200, key_authorization))
        misses += [
            ("miss", prefix + secrets.token_urlsafe(32), host, 404, NOT_FOUND_BODY),  # unknown token
            ("miss", prefix + token, other_host, 404, NOT_FOUND_BODY),  # another hostname's token
            ("miss", prefix + token, "unknown." + host, 404, NOT_FOUND_BODY),  # wrong host
        ]
    misses += [
        ("miss", "/", planted[0][0], 404, NOT_FOUND_BODY),
        ("miss", prefix + "short", planted[0][0], 404, NOT_FOUND_BODY),
    ]
    rounds = []
    for i in range(max(len(valid), len(misses))):
        rounds += [valid[i % len(valid)], misses[i % len(misses)]]
    return [
        {"kind": k, "path": p, "host": h, "status": s, "body": b, "request": _request_bytes(p, h)}
        for k, p, h, s, b in rounds
    ]


@pytest.fixture
async def planted(deployment: Deployment, db: asyncpg.Pool, client: CertflowClient):  # type: ignore[no-untyped-def]
    """Open challenges for hostnames no workflow handles; the reconcile schedule (which
    would start workflows for such rows) is paused meanwhile."""
    rows: list[tuple[str, str, str, str]] = []
    async with reconcile_schedule_paused(client, "tests/e2e/test_responder_load.py"):
        try:
            for _ in range(PLANTED):
                hostname = deployment.bare_hostname("load")
                certificate_id, order = await plant_challenge(db, hostname)
                rows.append((certificate_id, hostname, order.token, order.key_authorization))
            yield [(h, t, k) for _, h, t, k in rows]
        finally:
            for certificate_id, *_ in rows:
                await certificates.delete(db, certificate_id)


async def _wait_active(
    client: CertflowClient, hostnames: Sequence[str], timeout: float
) -> dict[str, float]:
    started = time.monotonic()
    done: dict[str, float] = {}
    while len(done) < len(hostnames):
        for hostname in hostnames:
            if hostname not in done:
                report = await client.status(hostname)
                if report is not None and report.status == "ACTIVE":
                    done[hostname] = time.monotonic() - started
        if time.monotonic() - started > timeout:
            pending = {h: await client.status(h) for h in hostnames if h not in done}
            raise AssertionError(f"not ACTIVE during the load after {timeout:.0f}s: {pending}")
        await asyncio.sleep(0.2)
    return done


def _responder_errors(new_log: bytes) -> list[str]:
    problems = []
    for raw in new_log.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            problems.append(raw.decode(errors="replace")[:300])
            continue
        text = json.dumps(entry)
        if str(entry.get("logger", "")).startswith(("uvicorn", "certflow.edge.responder")) or "responder.py" in text:
            if entry.get("level") in ("error", "critical") or "exception" in entry:
                problems.append(text[:300])
    return problems


async def test_responder_under_load_while_issuing(
    deployment: Deployment,
    client: CertflowClient,
    planted: list[tuple[str, str, str]],
    tmp_path: Path,
) -> None:
    port = deployment.pebble.http01_port
    targets = _targets(planted)
    random.Random(7).shuffle(targets)
    spec = {"port": port, "seconds": LOAD_SECONDS, "concurrency": CONCURRENCY, "targets": targets}
    spec_file = tmp_path / "load-spec.json"
    spec_file.write_text(json.dumps(spec))
    log_offset = deployment.worker.log.stat().st_size

    wrk = shutil.which("wrk")
    if wrk is not None:
        load = asyncio.create_task(asyncio.to_thread(_run_wrk, wrk, spec, tmp_path))
    else:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.test_responder_load", "--generate", str(spec_file),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )

        async def collect() -> dict[str, Any]:
            out, err = await asyncio.wait_for(process.communicate(), LOAD_SECONDS + 120)
            assert process.returncode == 0, f"load generator failed: {err.decode()[-2000:]}"
            result: dict[str, Any] = json.loads(out)
            return result

        load = asyncio.create_task(collect())

    # Issuance continues: two certificates requested once the load is on (most of
    # its connections open at the responder), not after a guessed delay.
    deadline = time.monotonic() + 60
    while (open_now := _established_to(port)) < CONCURRENCY // 2:
        assert not load.done(), "the load generator ended before its connections were open"
        assert time.monotonic() < deadline, f"only {open_now} load connections open after 60 s"
        await asyncio.sleep(0.05)
    hostnames = [deployment.hostname("under-load") for _ in range(2)]
    await client.request(hostnames)
    try:
        issued = await _wait_active(client, hostnames, ISSUANCE_DEADLINE_S)
        load_still_running = not load.done()
    finally:
        result = await load
    print(
        f"\nresponder load ({result['tool']}, {CONCURRENCY} connections, {result['seconds']}s):"
        f" {result['requests']} requests, {result['throughput']} req/s,"
        f" p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms;"
        f" {result['counts']}; timeouts {result['timeouts']}; errors {result['errors']};"
        f" requested with {open_now} load connections open: "
        + ", ".join(f"{h} ACTIVE after {s:.1f}s" for h, s in issued.items())
        + (" (during the load)" if load_still_running else " (the load had ended by then)")
    )
    assert result["errors"] == 0, result["error_samples"]
    assert result["timeouts"] == 0, f"{result['timeouts']} requests unanswered for {REQUEST_TIMEOUT_S:g} s"
    assert result["counts"]["valid wrong"] == 0 and result["counts"]["miss wrong"] == 0, result
    assert result["counts"]["valid ok"] > 0 and result["counts"]["miss ok"] > 0, result
    new_log = await worker_log_after_sentinel(deployment.worker, log_offset)
    problems = _responder_errors(new_log)
    assert not problems, "the responder logged errors under load:\n" + "\n".join(problems[:10])
