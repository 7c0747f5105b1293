"""Logging set-up: one JSON object per line (or plain text), never key material.

Fields given with ``extra=`` (hostname, workflow_id, phase, error_code,
problem_type, detail, …) become top-level keys; Temporal's activity and
workflow loggers contribute their context (workflow id, activity type, attempt).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

# Attributes every LogRecord has; anything else came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name in _STANDARD or name.startswith("_"):
                continue
            if name in ("temporal_workflow", "temporal_activity") and isinstance(value, dict):
                entry.update({k: v for k, v in value.items() if k in _TEMPORAL_KEYS})
                workflow_id = str(value.get("workflow_id", ""))
                if workflow_id.startswith("certificate:"):
                    entry.setdefault("hostname", workflow_id.removeprefix("certificate:"))
                continue
            entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


_TEMPORAL_KEYS = {"workflow_id", "run_id", "workflow_type", "activity_type", "attempt", "task_queue"}


def configure_logging(fmt: str = "json", level: str = "INFO") -> None:
    """Route every logger to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "text":
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
        )
    else:
        handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The acme library logs whole JWS payloads and responses at DEBUG.
    logging.getLogger("acme").setLevel(max(logging.INFO, root.level))
