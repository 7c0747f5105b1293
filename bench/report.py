"""The comparison table, the ratios and the targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.stats import ratio


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _baseline(result: dict[str, Any], key: str) -> dict[str, Any]:
    return result.get(key) or {}


def ratios(baselines: dict[str, Any], certflow: dict[str, Any]) -> dict[str, Any]:
    """certflow / plain and certflow / floor for each N.

    Latency is compared with the baseline's uncontended (1-thread) p50, throughput
    with its best thread count."""
    out: dict[str, Any] = {}
    for n, run in certflow.items():
        p50 = run["time_to_active_seconds"]["p50"]
        rate = run["certs_per_second"]
        row = {}
        for mode in ("plain", "floor"):
            single = _baseline(baselines.get(mode, {}), "single_thread")
            best = _baseline(baselines.get(mode, {}), "best")
            row[f"p50_over_{mode}_p50"] = _round(ratio(p50, single.get("seconds_per_cert", {}).get("p50")))
            row[f"throughput_over_{mode}_best"] = _round(ratio(rate, best.get("certs_per_second")))
        out[n] = row
    return out


CPU_TARGET = 0.115
"""Half the CPU-seconds per issuance of the worker, Temporal and Postgres when issue
25 was filed (about 0.23)."""


def _cpu_sum(run: dict[str, Any]) -> float | None:
    cpu = run.get("cpu_seconds_per_cert")
    if not cpu:
        return None
    return round(sum(cpu.get(name) or 0.0 for name in ("worker", "temporal", "postgres")), 4)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def targets(baselines: dict[str, Any], certflow: dict[str, Any], idle: dict[str, Any] | None) -> list[dict[str, Any]]:
    plain_single = _baseline(baselines.get("plain", {}), "single_thread")
    plain_best = _baseline(baselines.get("plain", {}), "best")
    floor_single = _baseline(baselines.get("floor", {}), "single_thread")
    floor_best = _baseline(baselines.get("floor", {}), "best")
    found: list[dict[str, Any]] = []

    def add(name: str, measured: float | None, limit: float | None, ok: bool | None, floor: float | None, unit: str) -> None:
        found.append(
            {
                "target": name,
                "measured": _round(measured),
                "limit": _round(limit),
                "unit": unit,
                "result": "NOT MEASURED" if ok is None else ("PASS" if ok else "FAIL"),
                "ratio_to_floor": _round(floor),
            }
        )

    one = certflow.get("1")
    plain_p50 = plain_single.get("seconds_per_cert", {}).get("p50")
    p50 = one["time_to_active_seconds"]["p50"] if one else None
    limit = 0.25 * plain_p50 if plain_p50 else None
    add(
        "p50 time to ACTIVE at N=1 <= 0.25 x plain p50",
        p50,
        limit,
        None if p50 is None or limit is None else p50 <= limit,
        ratio(p50, floor_single.get("seconds_per_cert", {}).get("p50")),
        "s",
    )
    fifty = certflow.get("50")
    rate = fifty["certs_per_second"] if fifty else None
    best = plain_best.get("certs_per_second")
    limit = 0.5 * best if best else None
    add(
        "throughput at N=50 >= 0.5 x plain best",
        rate,
        limit,
        None if rate is None or limit is None else rate >= limit,
        ratio(rate, floor_best.get("certs_per_second")),
        "certs/s",
    )
    # Issue 25's targets: against the bare protocol, and per issuance.
    floor_p50 = floor_single.get("seconds_per_cert", {}).get("p50")
    limit = 3.0 * floor_p50 if floor_p50 else None
    add("p50 time to ACTIVE at N=1 <= 3 x floor p50", p50, limit,
        None if p50 is None or limit is None else p50 <= limit, ratio(p50, floor_p50), "s")
    floor_rate = floor_best.get("certs_per_second")
    limit = 0.5 * floor_rate if floor_rate else None
    add("throughput at N=50 >= 0.5 x floor best", rate, limit,
        None if rate is None or limit is None else rate >= limit, ratio(rate, floor_rate), "certs/s")
    add("throughput at N=50 > plain best", rate, best,
        None if rate is None or best is None else rate > best, ratio(rate, floor_rate), "certs/s")
    events = one["temporal"]["events_per_cert_to_active"] if one else None
    add("history events per issuance <= 20", events, 20.0, None if events is None else events <= 20, None, "events")
    pg = one["pg_per_cert_to_parked"] if one else None
    statements = pg["statements"] if pg else None
    add("Postgres statements per issuance <= 6", statements, 6.0,
        None if statements is None else statements <= 6, None, "statements")
    # At N=50, where the worker's and the server's idle work between requests is
    # spread over many issuances (N=1 runs one at a time, with gaps).
    cpu_sum = _cpu_sum(fifty) if fifty else None
    add(f"CPU s per issuance at N=50, worker+Temporal+Postgres <= {CPU_TARGET} (half of 0.23)", cpu_sum, CPU_TARGET,
        None if cpu_sum is None else cpu_sum <= CPU_TARGET, None, "CPU s")
    big = certflow.get("500")
    rss = big["worker_peak_rss_mb"] if big else None
    add("worker peak RSS at N=500 <= 300 MB", rss, 300.0, None if rss is None else rss <= 300.0, None, "MB")
    # Idle targets are judged on the long-run figures: the steady state plus the
    # reconcile pass amortized over its interval.
    queries = None
    if idle is not None:
        queries = idle["pg_statements_per_minute_with_reconcile_amortized"]
        if queries is None:
            queries = idle["pg_xact_commit_per_minute"]
    n_idle = idle["certificates"] if idle else "N"
    add(f"idle ({n_idle} certs): Postgres queries/min < 1", queries, 1.0,
        None if queries is None else queries < 1.0, None, "per min")
    cpu = idle["worker_cpu_percent_with_reconcile_amortized"] if idle else None
    add(f"idle ({n_idle} certs): worker CPU < 1 %", cpu, 1.0, None if cpu is None else cpu < 1.0, None, "% of a core")
    return found


def cpu_split(run: dict[str, Any]) -> str:
    """CPU seconds per certificate: worker + Temporal + Postgres = their sum."""
    cpu = run.get("cpu_seconds_per_cert")
    if not cpu:
        return "-"
    parts = [cpu.get(name) or 0.0 for name in ("worker", "temporal", "postgres")]
    return "+".join(f"{p:.3f}" for p in parts) + f" = {_cpu_sum(run):.3f}"


def _certflow_row(label: str, run: dict[str, Any]) -> tuple[str, ...]:
    lat = run["time_to_active_seconds"]
    pg = run["pg_per_cert_to_parked"]
    stmt = pg["statements"] if pg["statements"] is not None else pg["xact_commit"]
    return (label, _fmt(lat["p50"]), _fmt(lat["p95"]), _fmt(run["wall_seconds"], 2),
            _fmt(run["certs_per_second"], 2), _fmt(run["worker_peak_rss_mb"], 1), _fmt(stmt, 1),
            _fmt(run["temporal"]["events_per_cert_to_active"], 0),
            _fmt(run["temporal"].get("billable_actions_per_cert_to_active"), 0),
            _fmt(run.get("heartbeats_per_cert"), 2), cpu_split(run))


def table(result: dict[str, Any]) -> str:
    header = (
        "", "p50 s", "p95 s", "wall s", "certs/s", "peak RSS MB", "PG stmt/cert", "events/cert",
        "billable/cert", "heartbeats/cert", "CPU s/cert worker+temporal+pg",
    )
    rows: list[tuple[str, ...]] = [header]
    for mode in ("plain", "floor"):
        base = result["baselines"].get(mode)
        if not base:
            continue
        for label, trial in (("1 thread", base["single_thread"]), (f"best: {base['best']['threads']} threads", base["best"])):
            if trial is None:
                continue
            lat = trial["seconds_per_cert"]
            rows.append((f"{mode} ({label})", _fmt(lat["p50"]), _fmt(lat["p95"]), _fmt(trial["wall_seconds"], 2),
                         _fmt(trial["certs_per_second"], 2), "-", "-", "-", "-", "-", "-"))
    before = result.get("before") or {}
    for n, run in result["certflow"].items():
        old = (before.get("certflow") or {}).get(n)
        if old is not None:
            rows.append(_certflow_row(f"certflow N={n} at {before['ref']}", old))
        rows.append(_certflow_row(f"certflow N={n}" + (f" (x{run['repeats']} runs)" if n == "1" else ""), run))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))

    lines.append("")
    for n, row in result["ratios"].items():
        lines.append(
            f"N={n}: p50 certflow/plain {_fmt(row['p50_over_plain_p50'])}, certflow/floor {_fmt(row['p50_over_floor_p50'])};"
            f" throughput certflow/plain-best {_fmt(row['throughput_over_plain_best'])},"
            f" certflow/floor-best {_fmt(row['throughput_over_floor_best'])}"
        )
    idle = result.get("idle")
    if idle:
        lines.append("")
        lines.append(
            f"idle {idle['certificates']} certs over {idle['window_seconds']} s: worker CPU {idle['worker_cpu_percent']} %,"
            f" worker RSS {_fmt(idle['worker_rss_mb'], 1)} MB, PG statements/min {_fmt(idle['pg_statements_per_minute'], 2)},"
            f" PG xact/min {_fmt(idle['pg_xact_commit_per_minute'], 2)}, Temporal CPU {idle['temporal_cpu_percent']} %,"
            f" Postgres CPU {idle['postgres_cpu_percent']} %; parked in {idle['parked_after_seconds']} s"
            f" ({idle['parked_per_second']}/s)"
        )
        rec = idle.get("reconcile_pass") or {}
        lines.append(
            f"  one reconcile pass (every {idle['reconcile_interval_seconds']} s): {rec.get('seconds')} s,"
            f" {rec.get('pg_statements')} PG statements, CPU s {rec.get('cpu_seconds')};"
            f" PG statements/min with it amortized: {_fmt(idle.get('pg_statements_per_minute_with_reconcile_amortized'), 2)},"
            f" worker CPU with it amortized: {_fmt(idle.get('worker_cpu_percent_with_reconcile_amortized'), 2)} %"
            f"; reconcile ran inside the window: {idle['reconcile_ran_in_window']}"
        )
    lines.append("")
    for t in result["targets"]:
        floor = f"; ratio to floor {_fmt(t['ratio_to_floor'])}" if t["ratio_to_floor"] is not None else ""
        lines.append(f"{t['result']:12} {t['target']}: measured {_fmt(t['measured'])} {t['unit']}, limit {_fmt(t['limit'])}{floor}")
    return "\n".join(lines)


def warnings(result: dict[str, Any]) -> list[str]:
    """Things that make this run's numbers suspect."""
    found = []
    meta = result["meta"]
    if meta.get("code_at_start") != meta.get("code_at_end"):
        found.append(
            f"the live tree changed during the run ({meta['code_at_start']} -> {meta['code_at_end']});"
            f" workers ran from the snapshot taken at the start ({meta['code_at_start']})"
        )
    phases = {f"N={n}": run for n, run in result["certflow"].items()}
    if result.get("idle"):
        phases["idle"] = result["idle"]
    for name, phase in phases.items():
        levels = phase.get("worker_log_levels", {})
        bad = {k: v for k, v in levels.items() if k in ("warning", "error", "critical")}
        if bad:
            found.append(f"{name}: worker logged {bad} (see the worker log)")
        others = phase.get("cpu_percent_during_issuance", {}).get("others", phase.get("others_cpu_percent"))
        if others is not None and others > 20:
            found.append(f"{name}: other processes used {others} % of a core meanwhile (shared machine)")
    return found


def _block(name: str, command: str) -> tuple[str, str]:
    """The markers around the bench's block ``name`` in the docs."""
    return f"<!-- bench:{name}:begin (written by {command}) -->", f"<!-- bench:{name}:end -->"


ISSUANCE_BLOCK = _block("issuance", "python -m bench --write-docs")
METHODS_BLOCK = _block("methods", "python -m bench --methods --write-docs")


def markdown(result: dict[str, Any]) -> str:
    """The table, ratios and targets as the docs show them, with the run they come from."""
    rows = table(result).split("\n")
    meta = result["meta"]
    args = meta.get("args", {})
    command = "python -m bench --sizes " + ",".join(str(n) for n in args.get("sizes", []))
    if args.get("compare"):
        command += f" --compare {args['compare']}"
    if args.get("precompile") is False:
        command += " --no-precompile"
    head = [
        f"Run at commit {meta['code_at_start']} (`{command} --write-docs`), {meta['cpus']} cores,"
        f" Python {meta['python']}, Postgres {meta['postgres']}, finished {meta['finished_at']}:",
        "",
        "```text",
    ]
    return "\n".join(head + rows + ["```"])


def methods_markdown(found: dict[str, Any], table_text: str) -> str:
    """The methods table as the docs show it, with the run it comes from."""
    meta = found["meta"]
    return "\n".join([
        f"Run at commit {meta['code_at_start']} (`{meta['command']}`), {meta['cpus']} cores,"
        f" Python {meta['python']}, finished {meta['finished_at']}:",
        "",
        table_text,
    ])


def write_docs(body: str, path: Path, block: tuple[str, str] = ISSUANCE_BLOCK) -> None:
    """Replace the bench's ``block`` in ``path`` (between its two markers) with ``body``."""
    begin, end_marker = block
    text = path.read_text()
    start, end = text.index(begin) + len(begin), text.index(end_marker)
    path.write_text(text[:start] + "\n" + body + "\n" + text[end:])
