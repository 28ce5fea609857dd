"""Fixtures of the Python-backend tests: a repository of the example models plus the test models here."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.python_clients import SERVER_ENV, load_args

MODELS = Path(__file__).resolve().parent / "models"
# Loaded at start; `init_fails` and `spare` are loaded by the tests about loading.
SERVED = ["simple", "add_sub", "bls_sync", "bls_async", "repeat_int32", "square_int32", "sum_squares", "whoami",
          "faulty", "sleepy", "auto_add", "batch_counter", "forgetful", "model_control"]


@pytest.fixture(scope="session")
def python_repo(tmp_path_factory) -> Path:
    from build_repository import build

    out = tmp_path_factory.mktemp("python_repo")
    build(out, ["simple", "add_sub"])
    for model in MODELS.iterdir():
        shutil.copytree(model, out / model.name)
    return out


@pytest.fixture(scope="session")
def python_server(python_repo):
    """One server for the tests that leave every model as they found it."""
    from helpers.serverproc import ServerProcess

    with ServerProcess([python_repo], *load_args(SERVED), env=SERVER_ENV) as server:
        yield server
