"""Fixtures of the observability tests: a repository with `simple` and `ensemble_add_sub`."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ensemble_repo(tmp_path_factory) -> Path:
    from build_repository import build

    repo = tmp_path_factory.mktemp("observability_repo")
    build(repo, ["simple", "ensemble_add_sub"])
    return repo
