"""``python -m bench``: certflow against bare ``acme`` baselines on real local servers.

    python -m bench --quick                       # sizes 1,10, short baseline trials
    python -m bench --sizes 1,50,500 --idle 5000  # the full run
    python -m bench --scale 20000                 # only the scale phase, merged into --out
    python -m bench --methods 7                   # only dns-01 beside http-01 on real DNS, merged into --out
    python -m bench --timeline 21                 # only where one issuance's time goes, event by event
    python -m bench --schedules --compare REF     # only the schedules' bill per firing and per hour, REF beside the tree
    python -m bench --edges                       # only the edges: served latency, cold convergence, handshakes/s
    python -m bench --sizes 1,50 --compare REF --write-docs
                                                  # REF's product beside the tree's; the table into docs/performance.md

Starts Pebble (VA no-sleep, no nonce rejection) with challtestsrv and Postgres
(``DATABASE_URL`` or embedded, with pg_stat_statements when it can be loaded)
once; each certflow phase gets its own Temporal dev server, database and worker.
The baselines run first, while nothing else holds Pebble's HTTP-01 port.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import baselines, edges, methods, report, scale_model, schedules, timeline
from bench.certflow_run import run_size
from bench.idle import run_idle
from bench.pgstats import PgStats
from bench.scale import run_scale
from bench.schedules import run_schedules
from bench.snapshot import code_version, snapshot, snapshot_of
from bench.stack import Stack, start_stack

DEFAULT_OUT = Path(__file__).resolve().parent / "results.json"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_ints, help="certflow batch sizes N (default 1,50,500)")
    parser.add_argument("--quick", action="store_true", help="short run: sizes 1,10, 5 s baseline trials")
    parser.add_argument("--idle", type=int, default=0, metavar="COUNT", help="idle phase with COUNT parked certificates")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle measurement window (default 60)")
    parser.add_argument(
        "--scale", type=int, nargs="?", const=20000, default=0, metavar="N",
        help="only the scale phase: N parked ACTIVE certificates' steady-state bill (default N 20000);"
        " its results go under the 'scale' key of --out, the other keys are kept",
    )
    parser.add_argument(
        "--scale-seconds", type=float, default=scale_model.SWEEP_SECONDS,
        help=f"steady window of the scale phase (default {scale_model.SWEEP_SECONDS:g}: one renewal-info"
        " sweep interval)",
    )
    parser.add_argument(
        "--methods", type=int, nargs="?", const=7, default=0, metavar="K",
        help="only the validation-method phase: K issuances over http-01, then K over delegated"
        " dns-01, on real DNS (Knot + Unbound; default K 7); its results go under the 'methods'"
        " key of --out, the other keys are kept",
    )
    parser.add_argument(
        "--timeline", type=int, nargs="?", const=21, default=0, metavar="K",
        help="only the timeline phase: K single issuances, the median offset of each history"
        " event from the request (default K 21); its results go under the 'timeline' key of"
        " --out, the other keys are kept",
    )
    parser.add_argument(
        "--schedules", type=int, nargs="?", const=20, default=0, metavar="K",
        help="only the schedules phase: K parked certificates (default 20), each schedule alone on"
        " product defaults, every firing read off the server's action counter; with --compare REF,"
        " REF's product first; its results go under the 'schedules' key of --out, the other keys are kept",
    )
    parser.add_argument(
        "--edges", type=int, nargs="?", const=50, default=0, metavar="N",
        help="only the edges phase (bench/edges.py): N rows made ACTIVE then renewed per edge kind"
        " (default N 50), a cold convergence and handshakes per second; its results go under the"
        " 'edges' key of --out, the other keys are kept",
    )
    parser.add_argument("--edges-cold", type=int, default=10_000, metavar="C",
                        help="certificates in the edges phase's cold convergence (default 10000)")
    parser.add_argument("--edges-seconds", type=float, default=10.0,
                        help="seconds of each handshake-rate trial (default 10)")
    parser.add_argument("--edges-kinds", default=",".join(edges.KINDS),
                        help=f"which edge kinds (default {','.join(edges.KINDS)})")
    parser.add_argument("--schedules-firings", type=int, default=2, metavar="F",
                        help="firings measured per schedule (default 2)")
    parser.add_argument(
        "--schedules-every", metavar="R,S",
        help="reconcile and sweep intervals in seconds instead of the product defaults (a quicker"
        " reading of the per-firing cost; the per-hour figures then follow these intervals)",
    )
    parser.add_argument("--threads", type=_ints, help="baseline thread counts (default 1,4,16,32)")
    parser.add_argument("--baseline-seconds", type=float, help="length of each baseline trial (default 12; quick 5)")
    parser.add_argument("--repeats", type=int, help="sequential single requests at N=1 (default 21; quick 3)")
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument(
        "--compare", metavar="REF",
        help="also run each certflow size on the product as committed at REF (git), just before"
        " the tree's: a before/after measured side by side in one run",
    )
    parser.add_argument(
        "--precompile", action=argparse.BooleanOptionalAction, default=True,
        help="compile the code snapshot the workers run to bytecode first, as pip and the"
        " Dockerfile ship it (default); --no-precompile: a tree without bytecode, whose workflow"
        " modules the sandbox compiles from source for every new run",
    )
    parser.add_argument(
        "--quiet-wait", type=float, default=300.0, metavar="SECONDS",
        help="before each phase wait up to this long for other processes to leave the CPU (default 300; 0: don't)",
    )
    parser.add_argument(
        "--write-docs", action="store_true",
        help=f"write the table into {DOCS} (its bench block), so the docs show this run",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    parser.add_argument("--workdir", type=Path, help="server logs and data (default: a temp dir, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir (logs) and databases")
    args = parser.parse_args(argv)
    quick = args.quick
    args.sizes = args.sizes or ([1, 10] if quick else [1, 50, 500])
    args.threads = args.threads or ([1, 4, 16] if quick else [1, 4, 16, 32])
    args.baseline_seconds = args.baseline_seconds or (5.0 if quick else 12.0)
    args.repeats = args.repeats or (3 if quick else 21)
    return args


def log(message: str) -> None:
    print(message, flush=True)


def run_baselines(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    account = baselines.register_account(stack.pebble.directory_url, stack.pebble.ca_bundle)
    found: dict[str, Any] = {}
    with baselines.ChallengeServer(stack.pebble.http01_port) as server:
        for mode in ("plain", "floor"):
            log(f"baseline {mode}: {args.baseline_seconds:g} s per thread count {args.threads}")
            found[mode] = baselines.sweep(
                mode, account, args.threads, args.baseline_seconds, server.answers, log
            )
    return found


async def run_certflow(
    stack: Stack, args: argparse.Namespace, workdir: Path
) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    pg = await PgStats.connect(stack.stats_url, stack.statements)
    try:
        sizes: dict[str, Any] = {}
        before: dict[str, Any] = {}
        for n in args.sizes:
            if args.compare:
                await asyncio.to_thread(stack.wait_machine_quiet, f"certflow N={n} at {args.compare}")
                log(f"certflow N={n} at {args.compare}")
                old = dataclasses.replace(
                    stack, code=snapshot_of(args.compare, workdir / "code-before", args.precompile)
                )
                before[str(n)] = await run_size(old, pg, n, workdir / f"before-n{n}", args.repeats, log)
            await asyncio.to_thread(stack.wait_machine_quiet, f"certflow N={n}")
            log(f"certflow N={n}")
            started = time.monotonic()
            sizes[str(n)] = await run_size(stack, pg, n, workdir / f"n{n}", args.repeats, log)
            sizes[str(n)]["phase_seconds"] = round(time.monotonic() - started, 1)
        idle = None
        if args.idle:
            await asyncio.to_thread(stack.wait_machine_quiet, "idle")
            log(f"idle: {args.idle} certificates, {args.idle_seconds:g} s window")
            started = time.monotonic()
            idle = await run_idle(stack, pg, args.idle, args.idle_seconds, workdir / "idle", log)
            idle["phase_seconds"] = round(time.monotonic() - started, 1)
        return sizes, idle, before
    finally:
        await pg.close()


async def run_scale_phase(stack: Stack, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    pg = await PgStats.connect(stack.stats_url, stack.statements)
    try:
        await asyncio.to_thread(stack.wait_machine_quiet, "scale")
        log(f"scale: {args.scale} certificates, {args.scale_seconds:g} s steady window")
        return await run_scale(stack, pg, args.scale, args.scale_seconds, workdir / "scale", log)
    finally:
        await pg.close()


def _run_meta(stack: Stack, began: float, code_at_start: str) -> dict[str, Any]:
    """What every results file says about the run that wrote it."""
    return {
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "total_seconds": round(time.monotonic() - began, 1),
        "code_at_start": code_at_start,
        "code_at_end": code_version(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "postgres": stack.postgres_source,
        "machine_quiet_waits": stack.quiet_waits,
    }


async def run_methods_phase(stack: Stack, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    await asyncio.to_thread(stack.wait_machine_quiet, "methods")
    log(f"methods: {args.methods} issuances over http-01, then {args.methods} over dns-01")
    return await methods.run_methods(stack, args.methods, workdir / "methods", log)


async def run_timeline_phase(stack: Stack, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    await asyncio.to_thread(stack.wait_machine_quiet, "timeline")
    log(f"timeline: {args.timeline} single issuances")
    return await timeline.run_timeline(stack, args.timeline, workdir / "timeline", log)


async def run_schedules_phase(stack: Stack, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    env: dict[str, str] = {}
    if args.schedules_every:
        reconcile, sweep = args.schedules_every.split(",")
        env = {"CERTFLOW_RECONCILE_INTERVAL_SECONDS": reconcile, "CERTFLOW_RENEWAL_INFO_SWEEP_SECONDS": sweep}
    runs: dict[str, Any] = {}
    if args.compare:
        await asyncio.to_thread(stack.wait_machine_quiet, f"schedules at {args.compare}")
        log(f"schedules at {args.compare}: {args.schedules} certificates, {args.schedules_firings} firing(s) each")
        old = dataclasses.replace(stack, code=snapshot_of(args.compare, workdir / "code-before", args.precompile))
        runs[f"at {args.compare}"] = await run_schedules(
            old, args.schedules, args.schedules_firings, "schedules_before", env, log
        )
    await asyncio.to_thread(stack.wait_machine_quiet, "schedules")
    log(f"schedules: {args.schedules} certificates, {args.schedules_firings} firing(s) each")
    runs["tree"] = await run_schedules(stack, args.schedules, args.schedules_firings, "schedules", env, log)
    levels: dict[str, int] = {}
    for found in runs.values():
        for k, v in found["worker_log_levels"].items():
            levels[k] = levels.get(k, 0) + v
    return {"runs": runs, "worker_log_levels": levels}


async def run_edges_phase(stack: Stack, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    await asyncio.to_thread(stack.wait_machine_quiet, "edges")
    kinds = [k.strip() for k in args.edges_kinds.split(",") if k.strip()]
    found = await edges.run_edges(stack, kinds, args.edges, args.edges_cold, args.edges_seconds, workdir, log)
    return {**found, "worker_log_levels": {}}


def main_phase(args: argparse.Namespace, key: str) -> int:
    """One phase alone (``scale``, ``methods``, ``timeline`` or ``schedules``); its
    result replaces that key of ``--out``."""
    if key == "scale":
        warning = scale_model.check_interval(args.scale_seconds)
        if warning:
            log(f"WARNING: {warning}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="certflow-bench-"))
    began = time.monotonic()
    code_at_start = code_version()
    log(f"bench: servers starting (workdir {workdir})")
    stack = start_stack(workdir, snapshot(workdir / "code", args.precompile), args.quiet_wait)
    phase = {"scale": run_scale_phase, "methods": run_methods_phase, "timeline": run_timeline_phase,
             "schedules": run_schedules_phase, "edges": run_edges_phase}[key]
    try:
        found = asyncio.run(phase(stack, args, workdir))
    finally:
        stack.stop(drop_databases=not args.keep)
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    found["meta"] = {
        **_run_meta(stack, began, code_at_start),
        "pg_counting": "pg_stat_statements" if stack.statements else "unavailable",
        "command": " ".join(["python -m bench", *(sys.argv[1:] if sys.argv[1:] else [])]),
    }
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results[key] = found
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    shown = {
        "scale": lambda: scale_model.table(found),
        "methods": lambda: methods.table(found["blocks"]),
        "timeline": lambda: timeline.table(found),
        "schedules": lambda: schedules.table(found),
        "edges": lambda: edges.table(found),
    }[key]()
    log("")
    log(shown)
    if args.write_docs and key == "methods":
        report.write_docs(report.methods_markdown(found, shown), DOCS, report.METHODS_BLOCK)
        log(f"\nwrote the table into {DOCS}")
    if found["meta"]["code_at_start"] != found["meta"]["code_at_end"]:
        log("WARNING: the live tree changed during the run; workers ran from the snapshot taken at the start")
    bad = {k: v for k, v in found["worker_log_levels"].items() if k in ("warning", "error", "critical")}
    if bad:
        log(f"WARNING: the worker logged {bad} (see the worker log)")
    log(f"\nresults: {args.out} (key {key!r}; total {found['meta']['total_seconds']} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scale:
        return main_phase(args, "scale")
    if args.methods:
        return main_phase(args, "methods")
    if args.timeline:
        return main_phase(args, "timeline")
    if args.schedules:
        return main_phase(args, "schedules")
    if args.edges:
        return main_phase(args, "edges")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="certflow-bench-"))
    began = time.monotonic()
    code_at_start = code_version()
    log(f"bench: servers starting (workdir {workdir})")
    stack = start_stack(workdir, snapshot(workdir / "code", args.precompile), args.quiet_wait)
    counting = "pg_stat_statements" if stack.statements else "pg_stat_database (pg_stat_statements unavailable)"
    log(f"bench: Postgres {stack.postgres_source}, counting with {counting}; Pebble {stack.pebble.directory_url}")
    try:
        if not args.skip_baselines:
            stack.wait_machine_quiet("baselines")
        found_baselines = {} if args.skip_baselines else run_baselines(stack, args)
        sizes, idle, before = asyncio.run(run_certflow(stack, args, workdir))
    finally:
        stack.stop(drop_databases=not args.keep)
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result: dict[str, Any] = {
        "meta": {
            **_run_meta(stack, began, code_at_start),
            "pg_counting": counting,
            "pebble": "PEBBLE_VA_NOSLEEP=1, PEBBLE_WFE_NONCEREJECT=0, default authz reuse; EC P-256 keys everywhere",
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "notes": [
                "time to ACTIVE: the row's updated_at at the ACTIVE transition minus the time just before "
                "CertflowClient.request (all N hostnames in one call); time_from_row_insert: minus the row's insert",
                "N=1: p50/p95 over sequential single requests after one warm-up certificate",
                "latency ratios use the baseline's 1-thread p50; throughput ratios its best thread count",
                "CPU percentages are of one core (this machine has 2)",
                "issuance phases run with the reconcile schedule off; the idle phase with product defaults",
                "workers run from "
                + ("bytecode compiled first, as pip and the Dockerfile ship it" if args.precompile
                   else "source without bytecode (--no-precompile): each new run compiles its workflow modules"),
            ],
        },
        "baselines": found_baselines,
        "certflow": sizes,
        "idle": idle,
    }
    if args.compare:
        result["before"] = {"ref": args.compare, "certflow": before}
    if args.out.exists():  # the scale phase's results (``--scale``) stay
        kept = json.loads(args.out.read_text())
        result.update({k: v for k, v in kept.items() if k.startswith("scale") or k in ("methods", "schedules", "edges")})
    result["ratios"] = report.ratios(found_baselines, sizes)
    result["targets"] = report.targets(found_baselines, sizes, idle)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    log("")
    log(report.table(result))
    if args.write_docs:
        report.write_docs(report.markdown(result), DOCS)
        log(f"\nwrote the table into {DOCS}")
    for warning in report.warnings(result):
        log(f"WARNING: {warning}")
    log(f"\nresults: {args.out}  (total {result['meta']['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
