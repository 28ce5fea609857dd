"""Fixtures of the OpenVINO backend tests: minilm in both formats, built once per test session."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The ONNX tests' client helpers (HTTP and gRPC asked the same way) serve these tests too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "onnx"))


@pytest.fixture(scope="session")
def minilm_both_repo(tmp_path_factory) -> Path:
    """`minilm` (ONNX) and `minilm_ov` (its IR) from the example builder: ~40 s, once per session."""
    from build_repository import build

    out = tmp_path_factory.mktemp("minilm_both")
    build(out, ["minilm", "minilm_ov"])
    return out


@pytest.fixture(scope="session")
def minilm_texts() -> list[str]:
    return ["A man is eating food.",
            "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun by the river.",
            "ok"]
