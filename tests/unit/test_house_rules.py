"""What the repository promises a reader of its code: it stands alone (the
product cites its own docs/, never a specification the repository does not hold),
its errors form one tree, and its files stay small enough to read. Each rule was
checked once by breaking it: a "SPEC §" planted in certflow/errors.py; an
exception class on ``Exception`` in certflow/edge/maintain.py (as three were
written this session before the rule); workflows/obtain.py at 401 lines."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from certflow.errors import CertflowError

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [*(ROOT / "certflow").rglob("*.py"), *(ROOT / "workflows").rglob("*.py"),
           *(ROOT / "activities").rglob("*.py"), ROOT / "worker.py", ROOT / "starter.py"]
MAX_FILE_LINES = 400


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_the_product_cites_no_spec_it_does_not_hold() -> None:
    marker = "SPEC " + "§"
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in PRODUCT
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if marker in line
    ]
    assert found == []


def test_every_error_the_product_defines_is_a_certflow_error() -> None:
    """One tree: a caller catches CertflowError and has them all (the workflow's own
    control-flow signals, Stopped and AttemptFailed, included)."""
    outside = []
    for path in PRODUCT:
        if "class " not in path.read_text():
            continue
        module = importlib.import_module(_module(path))
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not issubclass(value, CertflowError)
            ):
                outside.append(f"{module.__name__}.{name}")
    assert outside == []


def test_no_product_file_is_longer_than_the_house_holds() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in PRODUCT
        if (lines := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}


def test_functions_over_80_lines_are_only_the_known_ones() -> None:
    """No new function over 80 lines; the ones listed are left to split (docs:
    the closing note of the session that wrote this). Red when one is added, and
    when a listed one is split (then take it off the list)."""
    known = {
        "certflow/temporal_config.py:load_temporal_connection",
        "certflow/acme/finalize.py:finalize",
        "workflows/certificate.py:run",
        "workflows/obtain.py:_issue",
        "worker.py:build",
    }
    found = set()
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > 80:
                    found.add(f"{path.relative_to(ROOT)}:{node.name}")
    assert found == known
