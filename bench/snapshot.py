"""A frozen copy of the code under test.

Other engineers commit while a bench runs, and Temporal's workflow sandbox
re-imports workflow modules from disk for every new run, so a worker started
from the live tree can end up mixing two versions. Workers therefore start with
their working directory in a copy taken when the bench starts (``python -m
worker`` puts its working directory first on ``sys.path``).
"""

from __future__ import annotations

import compileall
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("certflow", "workflows", "activities", "worker.py", "starter.py")


def code_version(root: Path = ROOT) -> str:
    """HEAD plus whether product files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *PRODUCT], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + (" (+uncommitted changes)" if dirty else "")


def snapshot(dest: Path, precompile: bool = True) -> Path:
    """Copy the product packages and entry points into ``dest``; returns it.

    ``precompile`` also writes ``__pycache__`` bytecode there, as production has
    it (``pip install`` compiles, the Dockerfile runs ``compileall``): with
    PYTHONDONTWRITEBYTECODE set, as on this machine, or a read-only tree,
    nothing else does, and the workflow sandbox then compiles the workflow
    modules from source for every new workflow run."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in PRODUCT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(source, dest / name)
    if precompile:
        compileall.compile_dir(dest, quiet=1)
    return dest


def snapshot_of(ref: str, dest: Path, precompile: bool = True) -> Path:
    """The product files as committed at ``ref`` (``--compare``: the "before" of a
    side-by-side run), copied into ``dest``; returns it."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", ref, "--", *PRODUCT], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    if precompile:
        compileall.compile_dir(dest, quiet=1)
    return dest
