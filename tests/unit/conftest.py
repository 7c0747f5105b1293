from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No CERTFLOW_* variable of the caller's environment leaks into a settings test."""
    for name in list(os.environ):
        if name.startswith("CERTFLOW_"):
            monkeypatch.delenv(name)
    return monkeypatch
