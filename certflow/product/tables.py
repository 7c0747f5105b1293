"""Certificate states as plain-text tables (the CLI and the demo print them)."""

from __future__ import annotations

from collections.abc import Sequence

from certflow.workflow_payloads import CertificateState


def print_table(reports: Sequence[CertificateState | None], hostnames: Sequence[str]) -> None:
    """HOSTNAME STATUS EXPIRES ERROR, one certificate a line."""
    rows = [("HOSTNAME", "STATUS", "EXPIRES", "ERROR")]
    for hostname, r in zip(hostnames, reports):
        if r is None:
            rows.append((hostname, "UNKNOWN", "", ""))
        else:
            expires = r.expires_at.strftime("%Y-%m-%d %H:%M UTC") if r.expires_at else ""
            error = f"{r.error_code}: {r.error_message}" if r.error_code else ""
            rows.append((r.hostname, str(r.status), expires, error))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(col.ljust(w) for col, w in zip(row, widths)) + "  " + row[3])
