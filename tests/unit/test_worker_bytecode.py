"""The worker says when its workflow modules have no bytecode.

The workflow sandbox imports the workflow modules afresh for every new run; a
tree without bytecode (PYTHONDONTWRITEBYTECODE, a read-only install) makes each
of those imports compile the source again, ~10 ms of a run's first workflow task
(docs/performance.md). Shown to fail once: with the check reduced to
``cached.exists()``, the stale-bytecode case went red.
"""

from __future__ import annotations

import os
import py_compile
from pathlib import Path

import workflows
from worker import modules_without_bytecode


def test_modules_without_bytecode_are_named_until_compiled(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("A = 1\n")
    (tmp_path / "b.py").write_text("B = 2\n")
    assert modules_without_bytecode(tmp_path) == ["a.py", "b.py"]
    py_compile.compile(str(tmp_path / "a.py"))
    assert modules_without_bytecode(tmp_path) == ["b.py"]


def test_bytecode_older_than_its_source_counts_as_missing(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    source.write_text("A = 1\n")
    compiled = py_compile.compile(str(source))
    assert compiled is not None
    cached = Path(compiled)
    later = cached.stat().st_mtime + 10
    os.utime(source, (later, later))  # edited after it was compiled
    assert modules_without_bytecode(tmp_path) == ["a.py"]


def test_the_default_is_the_workflows_package() -> None:
    names = {path.name for path in Path(workflows.__file__).parent.glob("*.py")}
    assert set(modules_without_bytecode()) <= names
    assert "certificate.py" in names
