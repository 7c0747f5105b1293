"""The scale phase's arithmetic: measured unit costs → per certificate-year (and
per certificate-day) at N, extrapolated to 100,000 and 1,000,000, the targets,
and the printed table.

Per certificate-year = cycles × (the steady part of one cycle, counted in real
histories) + the sweep's runs × (one run's cost, measured in the window) / N +
the reconcile passes × (one pass, measured on its own) / N + whatever else the
window showed. A 90-day certificate renewed at day 60 has 365 / 60 = 6.08 cycles
a year; the sweep runs every SWEEP_SECONDS, reconcile every RECONCILE_SECONDS
(product defaults), each certificate is checked ARI_CHECKS_PER_DAY times a day.
"""

from __future__ import annotations

import math
from typing import Any

from activities.renewal_info import PAGE as ARI_PAGE
from bench.actions import ACTION_KINDS, HEARTBEAT
from certflow.running.worker_settings import Settings

SWEEP_SECONDS = float(Settings.model_fields["renewal_info_sweep_seconds"].default)
RECONCILE_SECONDS = float(Settings.model_fields["reconcile_interval_seconds"].default)
ARI_PACE = float(Settings.model_fields["acme_polls_per_second"].default)
ARI_CHECKS_PER_DAY = 2.0
LIFETIME_DAYS, RENEW_AT_DAY, YEAR_DAYS = 90.0, 60.0, 365.0
CYCLES_PER_YEAR = YEAR_DAYS / RENEW_AT_DAY
DAY = 86400.0
SWEEPS_PER_DAY = DAY / SWEEP_SECONDS
PASSES_PER_DAY = DAY / RECONCILE_SECONDS
EXTRAPOLATE = (100_000, 1_000_000)
TARGET_ACTIONS, TARGET_STATEMENTS, TARGET_RECONCILE_CPU, TARGET_REFRESH_MS = 50.0, 1.0, 2.0, 50.0
ENSURE_SQL = "INSERT INTO certificates AS c"
BENCH_ONLY = ("grpc_PatchSchedule",)  # the bench's own pause/unpause of the schedule
SWEEP_SQL = ("ari_next_check_at <= now()", "AS a(id, serial, window_start")


def sweep_statements(checks: float) -> int:
    """Statements of one sweep run (activities/renewal_info.py): a due page read per
    page, one write per non-empty page, one more read after a full last page."""
    full, rest = divmod(round(checks), ARI_PAGE)
    return 2 * full + (2 if rest else 1)


def checks_per_sweep(n: float) -> float:
    return n * ARI_CHECKS_PER_DAY / SWEEPS_PER_DAY


def _count(by_text: dict[str, int], *needles: str) -> int:
    return sum(c for q, c in by_text.items() if any(n in q for n in needles))


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def units(m: dict[str, Any]) -> dict[str, Any]:
    """The measured unit costs the model multiplies."""
    n = m["certificates"]
    h = m["histories"]
    window = m["window"]
    sweeps = h["sweeps_in_window"]
    runs = max(1, sweeps["runs"])
    asked = sum(r["asked"] for r in sweeps["results"])
    seconds = [r["activity_seconds"] / r["asked"] for r in sweeps["results"] if r["asked"] and r["activity_seconds"]]
    # The window holds the sweeps and nothing else (its certificate events are
    # counted apart): every statement in it is the sweeps', the connection set-up
    # asyncpg does on a fresh pool connection (type introspection) included.
    by_text = window["pg_statements_by_text"]
    sweep_sql = sum(by_text.values())
    parking_sql = m["parking"]["from_pass_start_to_parked"]["pg_statements_by_text"]
    cycle_sql = m["cycle"]["measured"]["pg_statements_by_text"]
    samples = max(1, h["cycle"]["samples"])
    metric = window["temporal_action_metric"]
    default_metric = {k.split("/", 1)[1]: v for k, v in metric.items()
                      if k.startswith("default/") and k.split("/", 1)[1] not in BENCH_ONLY}
    cert_window = h["in_window_by_type"].get("Certificate", {})
    window_seconds = window["ended_at"] - window["started_at"]
    steady_pass = m["steady_reconcile_pass"]
    return {
        "cycle_steady": h["cycle"]["steady_part"],
        "cycle_renewal": h["cycle"]["renewal_part"],
        "ensure_statements_per_cert": _r(_count(parking_sql, ENSURE_SQL) / n, 4),
        "issuance_statements_each": _r(
            (sum(cycle_sql.values()) - _count(cycle_sql, *SWEEP_SQL) - _count(cycle_sql, ENSURE_SQL)) / (2 * samples), 1
        ),
        "sweep_runs_in_window": sweeps["runs"],
        "sweep_run": sweeps["per_run_mean"],
        "sweep_checks_per_run": _r(asked / runs, 1),
        "sweep_checks_per_run_model": _r(checks_per_sweep(n), 1),
        "sweep_statements_per_run": _r(sweep_sql / runs, 2),
        "sweep_statements_per_run_model": sweep_statements(asked / runs),
        "sweep_paging_statements_in_window": _count(by_text, *SWEEP_SQL),
        "window_statements_by_text": by_text,
        "sweep_seconds_per_check": _r(sum(seconds) / len(seconds), 4) if seconds else None,
        "ari_requests_per_check": _r(window["ari_requests_at_proxy"] / asked, 3) if asked else None,
        "sweep_action_metric_per_run": {k: _r(v / runs, 2) for k, v in default_metric.items()},
        "certificate_actions_in_window": cert_window.get("actions", 0),
        "certificate_events_in_window": cert_window.get("events", 0),
        "window_seconds": _r(window_seconds, 1),
        "reconcile_pass": h["reconcile_pass_runs"].get("steady", {}),
        "reconcile_pass_statements": steady_pass["pg_statements"],
        "sweep_heartbeats_per_run": _r(default_metric.get(HEARTBEAT, 0) / runs, 2),
        "reconcile_pass_action_metric": {
            k.split("/", 1)[1]: v for k, v in steady_pass["temporal_action_metric"].items() if k.startswith("default/")
        },
    }


def per_cert(u: dict[str, Any], n: float, measured_n: int) -> dict[str, Any]:
    """Per certificate-year (Temporal) and per certificate-day (Postgres, ARI) at n."""
    year = YEAR_DAYS * DAY
    scale_window = year / u["window_seconds"] / measured_n  # per-certificate background, per year

    def part(key: str) -> dict[str, float]:
        return {
            "cycle": CYCLES_PER_YEAR * u["cycle_steady"].get(key, 0.0),
            "sweep": SWEEPS_PER_DAY * YEAR_DAYS * u["sweep_run"].get(key, 0.0) / n,
            "reconcile": PASSES_PER_DAY * YEAR_DAYS * u["reconcile_pass"].get(key, 0.0) / n,
            "other": u[f"certificate_{key}_in_window"] * scale_window if key in ("actions", "events") else 0.0,
        }

    actions = part("actions")
    events = part("events")
    billable = part("billable")
    pages_ratio = sweep_statements(checks_per_sweep(n)) / max(1, u["sweep_statements_per_run_model"])
    # Statements per run: what one run sent at N, plus the paging model's difference.
    extra_pages = sweep_statements(checks_per_sweep(n)) - u["sweep_statements_per_run_model"]
    billable["heartbeats"] = (
        SWEEPS_PER_DAY * YEAR_DAYS * (u["sweep_heartbeats_per_run"] or 0.0) * pages_ratio
        + PASSES_PER_DAY * YEAR_DAYS * u["reconcile_pass_action_metric"].get(HEARTBEAT, 0)
    ) / n
    kinds = {k: _r(sum(part(k).values()), 2) for k in ACTION_KINDS}
    sweep_stmts = (u["sweep_statements_per_run"] or 0.0) + extra_pages
    statements = {
        "cycle": (u["ensure_statements_per_cert"] or 0.0) / RENEW_AT_DAY,
        "sweep": SWEEPS_PER_DAY * sweep_stmts / n,
        "reconcile": PASSES_PER_DAY * (u["reconcile_pass_statements"] or 0) / n,
    }
    capacity = ARI_PACE * DAY / n
    per_check = u["sweep_seconds_per_check"] or 1.0 / ARI_PACE
    issuance = CYCLES_PER_YEAR * u["cycle_renewal"].get("actions", 0.0)
    return {
        "temporal_actions_per_cert_year": _r(sum(actions.values()), 2),
        "temporal_actions_by_source": {k: _r(v, 2) for k, v in actions.items()},
        "temporal_actions_by_kind": kinds,
        "temporal_actions_incl_issuance": _r(sum(actions.values()) + issuance, 1),
        "billable_actions_per_cert_year": _r(sum(billable.values()), 2),
        "billable_actions_by_source": {k: _r(v, 2) for k, v in billable.items()},
        "history_events_per_cert_year": _r(sum(events.values()), 1),
        "history_events_by_source": {k: _r(v, 2) for k, v in events.items()},
        "pg_statements_per_cert_day": _r(sum(statements.values()), 4),
        "pg_statements_by_source": {k: _r(v, 5) for k, v in statements.items()},
        "pg_statements_per_cert_day_incl_issuance": _r(
            sum(statements.values()) + (u["issuance_statements_each"] or 0.0) / RENEW_AT_DAY, 3
        ),
        "ari_requests_per_cert_day": _r((u["ari_requests_per_check"] or 1.0) * ARI_CHECKS_PER_DAY, 3),
        "ari_checks_per_cert_day_the_pace_allows": _r(capacity, 3),
        "sweep_checks_per_run": _r(checks_per_sweep(n), 1),
        "sweep_statements_per_run": _r(sweep_stmts, 1),
        "sweep_run_seconds": _r(per_check * checks_per_sweep(n), 1),
        "sweep_keeps_up": per_check * checks_per_sweep(n) < SWEEP_SECONDS and capacity >= ARI_CHECKS_PER_DAY,
    }


def model(m: dict[str, Any]) -> dict[str, Any]:
    n = m["certificates"]
    u = units(m)
    cold, steady, edge, parking = m["cold_reconcile_pass"], m["steady_reconcile_pass"], m["edge"], m["parking"]
    rss_per_1000 = (m["worker_rss_mb_parked"] - m["worker_rss_mb_before_rows"]) * 1000 / n
    # The worker caches at most 1,000 workflow runs (the SDK's default): what a parked
    # workflow costs it beyond that is the growth over the second half of the parking.
    half = next((s for s in parking["rss_samples"] if s[1] >= n / 2 and s[2] is not None), None)
    marginal = rss_per_1000
    if half is not None and n > half[1]:
        marginal = max(0.0, (m["worker_rss_mb_parked"] - half[2]) * 1000 / (n - half[1]))
    # Rows the first pass got going: its count, or (when it failed) the rows seen by
    # their workflows when it returned.
    first_started = cold.get("started")
    if first_started is None:
        first_started = parking["rss_samples"][0][1] if parking["rss_samples"] else 0
    start_rate = first_started / cold["seconds"] if cold["seconds"] else None
    parked_after = cold["seconds"] + parking["seconds"]
    edge_mb_per_10k = edge["load_rss_growth_mb"] * 10_000 / n

    def at(size: int) -> dict[str, Any]:
        f = size / n
        return {
            **per_cert(u, size, n),
            "worker_rss_mb": _r(m["worker_rss_mb_parked"] + marginal * (size - n) / 1000, 0),
            "cold_pass_seconds": _r(size / start_rate, 0) if start_rate else None,
            "cold_parked_seconds": _r(parked_after * f, 0),
            "steady_reconcile_seconds": steady["seconds"],
            "steady_reconcile_worker_cpu_seconds": steady["cpu_seconds"]["worker"],
            "steady_reconcile_statements": steady["pg_statements"],
            "edge_first_load_seconds": _r(edge["first_load_seconds"] * f, 2),
            "edge_first_load_mb": _r(edge["load_rss_growth_mb"] * f, 0),
            "edge_refresh_no_change_ms": edge["refresh_no_change_median_ms"],
        }

    figures = {str(n): at(n), **{str(s): at(s) for s in EXTRAPOLATE}}
    figures[str(n)].update(
        worker_rss_mb=m["worker_rss_mb_parked"],
        cold_pass_seconds=cold["seconds"],
        cold_parked_seconds=_r(parked_after, 1),
        edge_first_load_seconds=edge["first_load_seconds"],
        edge_first_load_mb=edge["load_rss_growth_mb"],
    )
    here = figures[str(n)]
    targets = []
    for size, row in figures.items():
        targets.append(_target(f"Temporal actions per certificate-year excl. issuance (N={size})",
                               row["temporal_actions_per_cert_year"], TARGET_ACTIONS, "<="))
        targets.append(_target(f"Postgres statements per certificate-day (N={size})",
                               row["pg_statements_per_cert_day"], TARGET_STATEMENTS, "<="))
    targets.append(_target(f"one reconcile pass at {n} rows: worker CPU s", steady["cpu_seconds"]["worker"],
                           TARGET_RECONCILE_CPU, "<"))
    targets.append(_target(f"edge refresh of {edge['rows_loaded']} rows, no change: ms",
                           edge["refresh_no_change_median_ms"], TARGET_REFRESH_MS, "<"))
    return {
        "assumptions": {
            "certificate_lifetime_days": LIFETIME_DAYS,
            "renewed_at_day": RENEW_AT_DAY,
            "cycles_per_year": _r(CYCLES_PER_YEAR, 3),
            "ari_checks_per_cert_day": ARI_CHECKS_PER_DAY,
            "sweep_interval_seconds": SWEEP_SECONDS,
            "sweeps_per_day": SWEEPS_PER_DAY,
            "reconcile_interval_seconds": RECONCILE_SECONDS,
            "reconcile_passes_per_day": PASSES_PER_DAY,
            "ari_pace_per_second": ARI_PACE,
            "sweep_page": ARI_PAGE,
        },
        "units": u,
        "worker_rss_mb_per_1000_parked": _r(rss_per_1000, 2),
        "worker_rss_mb_per_1000_marginal": _r(marginal, 2),
        "cold_pass_starts_per_second": _r(start_rate, 1),
        "cold_first_pass_started": first_started,
        "cold_first_pass_error": cold.get("error"),
        "cold_extra_passes": len(parking.get("extra_reconcile_passes", [])),
        "cold_parked_per_second": _r(n / parked_after, 1) if parked_after else None,
        "edge_mb_per_10000_hostnames": _r(edge_mb_per_10k, 1),
        "edge_context_kb_each": edge["context_kb_each"],
        "edge_full_context_cache_mb": _r(edge["context_kb_each"] * 10_000 / 1024, 0),
        "figures": figures,
        "targets": targets,
        "reconcile_found_nothing": steady.get("started") == 0 and steady.get("refused") == 0,
        "at_n": here,
    }


def _target(name: str, measured: float | None, limit: float, op: str) -> dict[str, Any]:
    ok = None if measured is None else (measured <= limit if op == "<=" else measured < limit)
    return {"target": name, "measured": measured, "limit": f"{op} {limit:g}",
            "result": "NOT MEASURED" if ok is None else ("PASS" if ok else "FAIL")}


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


ROWS: tuple[tuple[str, str, int], ...] = (
    ("Temporal actions / cert-year, excl. issuance", "temporal_actions_per_cert_year", 1),
    ("  of which the cycle (6.08 x steady part)", "temporal_actions_by_source.cycle", 1),
    ("  of which the ARI sweep (shared)", "temporal_actions_by_source.sweep", 2),
    ("  of which reconcile (shared)", "temporal_actions_by_source.reconcile", 2),
    ("  of which other (certificate events in the window)", "temporal_actions_by_source.other", 2),
    ("  workflow starts", "temporal_actions_by_kind.workflow_starts", 2),
    ("  workflow tasks", "temporal_actions_by_kind.workflow_tasks", 2),
    ("  activity tasks", "temporal_actions_by_kind.activity_tasks", 2),
    ("  timers", "temporal_actions_by_kind.timers", 2),
    ("  signals", "temporal_actions_by_kind.signals", 2),
    ("  child workflows", "temporal_actions_by_kind.child_workflows", 2),
    ("Temporal actions / cert-year incl. renewals", "temporal_actions_incl_issuance", 0),
    ("Billable-style actions / cert-year (no WFTs; upserts, markers, heartbeats)", "billable_actions_per_cert_year", 1),
    ("History events / cert-year, excl. issuance", "history_events_per_cert_year", 0),
    ("Postgres statements / cert-day", "pg_statements_per_cert_day", 4),
    ("  of which the cycle (ensure_certificate)", "pg_statements_by_source.cycle", 4),
    ("  of which the ARI sweep", "pg_statements_by_source.sweep", 4),
    ("  of which reconcile", "pg_statements_by_source.reconcile", 4),
    ("Postgres statements / cert-day incl. renewals", "pg_statements_per_cert_day_incl_issuance", 3),
    ("ARI requests / cert-day", "ari_requests_per_cert_day", 2),
    ("  checks / cert-day the 20/s pace allows", "ari_checks_per_cert_day_the_pace_allows", 2),
    ("  sweep run: checks / statements / seconds", "sweep_run", 0),
    ("  sweep keeps up (run < interval, pace)", "sweep_keeps_up", 0),
    ("Worker RSS, MB (marginal growth per parked)", "worker_rss_mb", 0),
    ("Cold start: reconcile pass, s", "cold_pass_seconds", 0),
    ("Cold start: all parked, s", "cold_parked_seconds", 0),
    ("Steady reconcile pass: s / worker CPU s / stmts", "steady_pass", 0),
    ("Edge first load: s / MB", "edge_load", 0),
    ("Edge refresh, no change: ms", "edge_refresh_no_change_ms", 2),
)


def _cell(row: dict[str, Any], key: str, digits: int) -> str:
    if key == "sweep_run":
        return f"{_f(row['sweep_checks_per_run'], 0)} / {_f(row['sweep_statements_per_run'], 0)} / {_f(row['sweep_run_seconds'], 0)}"
    if key == "steady_pass":
        return (f"{_f(row['steady_reconcile_seconds'])} / {_f(row['steady_reconcile_worker_cpu_seconds'])}"
                f" / {_f(row['steady_reconcile_statements'])}")
    if key == "edge_load":
        return f"{_f(row['edge_first_load_seconds'])} / {_f(row['edge_first_load_mb'], 0)}"
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return _f(value, digits)


def table(scale: dict[str, Any]) -> str:
    mdl = scale["model"]
    n = scale["certificates"]
    sizes = [str(n), *(str(s) for s in EXTRAPOLATE)]
    header = ["", f"N={n:,} (measured)", *(f"{int(s):,} (extrapolated)" for s in sizes[1:])]
    rows = [header] + [[label, *(_cell(mdl["figures"][s], key, d) for s in sizes)] for label, key, d in ROWS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    u, a = mdl["units"], mdl["assumptions"]
    edge = scale["edge"]
    lines += [
        "",
        f"per cycle, counted in {scale['histories']['cycle']['samples']} real renewal cycles (the run after a"
        f" renewal, parked on its window): {_kinds(u['cycle_steady'])}; the renewal itself:"
        f" {_kinds(u['cycle_renewal'])}; a window the CA moves (rare: a revocation) adds"
        f" {_kinds(scale['histories']['cycle']['window_moved_part'])} up to begin_renewal",
        f"parked runs (cold start, {scale['histories']['parked']['runs']} read,"
        f" {scale['histories']['parked']['parked_on_timer']} on their timer):"
        f" {_kinds(scale['histories']['parked']['per_run_median'])}",
        f"sweep, {u['sweep_runs_in_window']} run(s) in the {u['window_seconds']:.0f} s window: {_kinds(u['sweep_run'])};"
        f" {u['sweep_checks_per_run']} checks/run (model {u['sweep_checks_per_run_model']}),"
        f" {u['sweep_statements_per_run']} statements/run (paging model {u['sweep_statements_per_run_model']}),"
        f" {u['ari_requests_per_check']} ARI GETs/check at the proxy; server action metric/run: {u['sweep_action_metric_per_run']}",
        f"steady reconcile pass: {_kinds(u['reconcile_pass'])}; action metric {u['reconcile_pass_action_metric']}",
        f"in the window: certificate workflows {u['certificate_events_in_window']} events; statements (all the"
        f" sweeps'): {_short_texts(u['window_statements_by_text'])}",
        f"worker RSS {scale['worker_rss_mb_before_rows']:.0f} MB before the rows, {scale['worker_rss_mb_parked']:.0f} MB"
        f" with {n:,} parked: {mdl['worker_rss_mb_per_1000_parked']} MB per 1,000 on average,"
        f" {mdl['worker_rss_mb_per_1000_marginal']} MB per 1,000 over the second half (used to extrapolate:"
        f" the SDK caches at most 1,000 runs)",
        f"cold start: the first pass {'FAILED (' + str(mdl['cold_first_pass_error'])[:160] + ')' if mdl['cold_first_pass_error'] else 'returned'}"
        f" after {scale['cold_reconcile_pass']['seconds']} s having started {mdl['cold_first_pass_started']:,}"
        f" ({mdl['cold_pass_starts_per_second']}/s); {mdl['cold_extra_passes']} more pass(es) back to back;"
        f" all {n:,} parked after {mdl['at_n']['cold_parked_seconds']} s ({mdl['cold_parked_per_second']}/s)",
        f"edge: {mdl['edge_mb_per_10000_hostnames']} MB per 10,000 hostnames loaded; contexts built lazily:"
        f" {edge['context_kb_each']} KB and {edge['context_build_ms_each']} ms each ({edge['contexts_built']} built),"
        f" a full 10,000-context cache {mdl['edge_full_context_cache_mb']} MB",
        f"assumptions: {a['cycles_per_year']} cycles/year (90-day certificates renewed at day 60),"
        f" {a['ari_checks_per_cert_day']:g} ARI checks/cert-day (Retry-After {86400 / a['ari_checks_per_cert_day']:.0f} s),"
        f" sweep every {a['sweep_interval_seconds']:g} s, reconcile every {a['reconcile_interval_seconds']:g} s"
        f" (product defaults); shared costs divided by N",
        "",
    ]
    for t in mdl["targets"]:
        lines.append(f"{t['result']:12} {t['target']}: {_f(t['measured'])} (target {t['limit']})")
    lines.append(f"reconcile at steady state found nothing to do: {mdl['reconcile_found_nothing']}")
    return "\n".join(lines)


def _short_texts(by_text: dict[str, int]) -> str:
    return "; ".join(f"{c} x {q[:60]}" for q, c in by_text.items()) or "none"


def _kinds(counts: dict[str, Any]) -> str:
    keys = (*ACTION_KINDS, "search_attribute_upserts", "marker_batches", "actions", "billable", "events")
    return ", ".join(f"{k} {_f(counts.get(k, 0))}" for k in keys if counts.get(k))


def check_interval(seconds: float) -> str | None:
    """A window that is not a whole number of sweep intervals holds a varying count."""
    if seconds % SWEEP_SECONDS:
        return (f"--scale-seconds {seconds:g} is not a multiple of the sweep interval ({SWEEP_SECONDS:g} s):"
                f" the window holds {math.floor(seconds / SWEEP_SECONDS)} or {math.ceil(seconds / SWEEP_SECONDS)} sweeps")
    return None
