"""A real Prometheus server on loopback, for tests of the alert rules against a
real worker: it scrapes the worker's /metrics, evaluates certflow's rules and
answers its HTTP API (the alerts it holds, instant queries).

Debian's ``prometheus`` package (scripts/setup.sh) ships the server and promtool.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.servers import _answers, _find_binary, _Process, _request, free_port

PROMETHEUS_HINT = "install it with `apt-get install prometheus` (scripts/setup.sh does)"
JOB = "certflow-worker"
"""The scrape job the rules expect (deploy/prometheus/prometheus.yml)."""


def scrape_config(rules: Path, targets: list[str], every_seconds: float = 1.0) -> str:
    """A config scraping ``targets`` as the worker job and evaluating ``rules``,
    both every ``every_seconds`` (JSON is YAML, so no YAML library is needed)."""
    interval = f"{every_seconds:g}s"
    return json.dumps(
        {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
        },
        indent=2,
    )


@dataclass
class PrometheusServer:
    """A running ``prometheus`` with its data in a temporary directory."""

    url: str
    _process: _Process = field(repr=False)

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of one HTTP API answer (``/api/v1/...``)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        answer = json.loads(_request(f"{self.url}/api/v1/{path}{query}"))
        assert answer.get("status") == "success", answer
        return answer["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert pending or firing now, as the API lists them."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    @property
    def log(self) -> Path:
        return self._process.log

    def stop(self) -> None:
        self._process.stop()


def start_prometheus(workdir: Path, config: str, timeout: float = 60.0) -> PrometheusServer:
    """Start Prometheus with ``config`` (see :func:`scrape_config`) on a free port."""
    binary = _find_binary("prometheus", PROMETHEUS_HINT)
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config)
    port = free_port()
    process = _Process(
        "prometheus",
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        workdir / "prometheus.log",
    )
    server = PrometheusServer(f"http://127.0.0.1:{port}", process)
    process.start()
    process.wait_ready(lambda: _answers(lambda: _request(f"{server.url}/-/ready")), timeout)
    return server
