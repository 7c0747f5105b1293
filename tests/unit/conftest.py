from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No CERTFLOW_* or TEMPORAL_* variable of the caller's environment leaks into a
    settings test, nor a Temporal profile file in the caller's home."""
    for name in list(os.environ):
        if name.startswith(("CERTFLOW_", "TEMPORAL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", os.devnull)
    return monkeypatch
