"""Fixtures of the ONNX backend tests: the minilm example model, built once per test session."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def minilm_repo(tmp_path_factory) -> Path:
    """A repository holding only `minilm` (torch export, ~10 s), shared by every test that needs it."""
    from build_repository import build

    out = tmp_path_factory.mktemp("minilm_repo")
    build(out, ["minilm"])
    return out
