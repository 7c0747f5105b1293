"""Memory and CPU of processes (and their process trees) from /proc."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the process's peak resident set size since it started."""
    kb = _status_kb(pid, "VmHWM")
    return None if kb is None else kb / 1024.0


def rss_mb(pid: int) -> float | None:
    kb = _status_kb(pid, "VmRSS")
    return None if kb is None else kb / 1024.0


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2 :].split()


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process plus cutime + cstime of its reaped children
    (so a tree's total does not drop when a child exits); 0 when it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # Fields 14-17 of /proc/<pid>/stat; index 0 here is field 3 (state).
    return sum(int(v) for v in fields[11:15]) / CLK_TCK


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_pid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_cpu_seconds(root: int) -> float:
    return sum(cpu_seconds(pid) for pid in tree_pids(root))


def system_busy_seconds() -> float:
    """CPU time all processes on the machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


@dataclass
class CpuSample:
    at: float
    seconds: dict[str, float]


def sample_cpu(roots: dict[str, int]) -> CpuSample:
    """CPU seconds so far of each named process tree, plus this process (``bench``)."""
    seconds = {name: tree_cpu_seconds(pid) for name, pid in roots.items()}
    own = os.times()
    seconds["bench"] = own.user + own.system
    seconds["machine"] = system_busy_seconds()
    return CpuSample(time.monotonic(), seconds)


def cpu_percent(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """Per process tree: % of one core over the interval (200 % = both cores here).

    ``machine`` is everything on the machine; ``others`` what processes outside the
    measured trees used (other workloads sharing the cores)."""
    elapsed = max(after.at - before.at, 1e-9)
    percent = {
        name: round(100.0 * (after.seconds[name] - before.seconds.get(name, 0.0)) / elapsed, 2)
        for name in after.seconds
    }
    ours = sum(v for k, v in percent.items() if k != "machine")
    percent["others"] = round(max(0.0, percent["machine"] - ours), 2)
    return percent


def cpu_seconds_per(before: CpuSample, after: CpuSample, count: int) -> dict[str, float]:
    """Per process tree: CPU seconds over the interval divided by ``count`` (per
    certificate), ``machine`` left out."""
    return {
        name: round((after.seconds[name] - before.seconds.get(name, 0.0)) / max(count, 1), 4)
        for name in after.seconds
        if name != "machine"
    }
