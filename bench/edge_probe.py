"""The TLS edge helper's cost, in a process of its own so that its memory is its own.

Run by bench/scale.py as ``python -P bench/edge_probe.py`` with PYTHONPATH at the
code snapshot and a JSON request on stdin: ``{"database_url", "key" (base64),
"hostnames" (to build contexts for), "refreshes"}``. Prints one JSON object:
``SniCertificates(pool, key)``'s first load (time, CPU, RSS growth), refreshes
with no change (times), and contexts built lazily with ``context_for``.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import sys
import time
from typing import Any

from certflow.crypto import EncryptionKey
from certflow.store.db import create_pool
from certflow.edge.serving import SniCertificates


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def settled_rss_kb() -> int:
    gc.collect()
    return rss_kb()


async def probe(request: dict[str, Any]) -> dict[str, Any]:
    key = EncryptionKey(base64.b64decode(request["key"]))
    pool = await create_pool(request["database_url"], min_size=1, max_size=2)  # the product's pool
    try:
        await pool.fetchval("SELECT 1")
        before = settled_rss_kb()
        certs = SniCertificates(pool, key)
        wall, cpu = time.perf_counter(), time.process_time()
        loaded = await certs.refresh()
        load_seconds, load_cpu = time.perf_counter() - wall, time.process_time() - cpu
        after_load = settled_rss_kb()

        refresh_ms: list[float] = []
        changed: list[int] = []
        for _ in range(int(request["refreshes"])):
            wall = time.perf_counter()
            changed.append(await certs.refresh())
            refresh_ms.append(round(1000 * (time.perf_counter() - wall), 3))

        hostnames: list[str] = request["hostnames"]
        wall = time.perf_counter()
        built = sum(1 for h in hostnames if certs.context_for(h) is not None)
        build_seconds = time.perf_counter() - wall
        after_contexts = settled_rss_kb()
        wall = time.perf_counter()
        for h in hostnames:
            certs.context_for(h)
        cached_seconds = time.perf_counter() - wall
    finally:
        await pool.close()
    ordered = sorted(refresh_ms)
    return {
        "rows_loaded": loaded,
        "first_load_seconds": round(load_seconds, 3),
        "first_load_cpu_seconds": round(load_cpu, 3),
        "rss_before_mb": round(before / 1024, 1),
        "rss_after_load_mb": round(after_load / 1024, 1),
        "load_rss_growth_mb": round((after_load - before) / 1024, 1),
        "refreshes_no_change_ms": refresh_ms,
        "refresh_no_change_median_ms": ordered[len(ordered) // 2] if ordered else None,
        "refresh_no_change_max_ms": ordered[-1] if ordered else None,
        "refresh_changed_counts": sorted(set(changed)),
        "contexts_built": built,
        "context_build_ms_each": round(1000 * build_seconds / max(built, 1), 3),
        "contexts_rss_growth_mb": round((after_contexts - after_load) / 1024, 1),
        "context_kb_each": round((after_contexts - after_load) / max(built, 1), 1),
        "cached_context_lookup_us_each": round(1e6 * cached_seconds / max(len(hostnames), 1), 2),
    }


def main() -> int:
    request = json.load(sys.stdin)
    print(json.dumps(asyncio.run(probe(request))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
