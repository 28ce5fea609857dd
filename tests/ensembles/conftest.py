"""Fixtures of the ensemble tests: a repository with `ensemble_add_sub`, broken ensembles and a failing model."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.ensemble_models import FAILS_CONFIG, fails_for_batch_one_model, write_ensemble


@pytest.fixture(scope="session")
def ensemble_repo(tmp_path_factory) -> Path:
    import onnx
    from build_repository import build

    repo = tmp_path_factory.mktemp("ensemble_repo")
    build(repo, ["simple", "simple_string", "ensemble_add_sub"])
    (repo / "fails" / "1").mkdir(parents=True)
    onnx.save(fails_for_batch_one_model(), str(repo / "fails" / "1" / "model.onnx"))
    (repo / "fails" / "config.pbtxt").write_text(FAILS_CONFIG)
    both = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    outputs = {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
    write_ensemble(repo, "ensemble_fails", [
        ("simple", both, {"OUTPUT0": "SUM", "OUTPUT1": "OUTPUT1"}),
        ("fails", {"INPUT0": "SUM"}, {"OUTPUT0": "OUTPUT0"})])
    # Broken ensembles, one per check the load makes.
    write_ensemble(repo, "bad_cycle", [
        ("simple", {"INPUT0": "INPUT0", "INPUT1": "B"}, {"OUTPUT0": "A", "OUTPUT1": "OUTPUT0"}),
        ("simple", {"INPUT0": "A", "INPUT1": "INPUT1"}, {"OUTPUT0": "B", "OUTPUT1": "OUTPUT1"})])
    write_ensemble(repo, "bad_unproduced", [("simple", {"INPUT0": "INPUT0", "INPUT1": "NOWHERE"}, outputs)])
    write_ensemble(repo, "bad_no_output", [("simple", both, {"OUTPUT0": "OUTPUT0"})])
    write_ensemble(repo, "bad_dtype", [
        ("simple", both, {"OUTPUT0": "SUM", "OUTPUT1": "OUTPUT1"}),
        ("simple_string", {"INPUT0": "SUM", "INPUT1": "SUM"}, {"OUTPUT0": "OUTPUT0"})])
    write_ensemble(repo, "bad_shape", [("simple", both, outputs)], dim=8)
    write_ensemble(repo, "bad_missing_model", [("simple", both, {"OUTPUT0": "OUTPUT0"}),
                                               ("no_such_model", both, {"OUTPUT1": "OUTPUT1"})])
    write_ensemble(repo, "bad_unknown_input", [("simple", {"INPUT0": "INPUT0", "INPUT1": "INPUT1", "INPUT9": "INPUT1"},
                                                outputs)])
    write_ensemble(repo, "bad_self", [("simple", both, {"OUTPUT0": "OUTPUT0"}), ("bad_self", both, {"OUTPUT1": "OUTPUT1"})])
    return repo
