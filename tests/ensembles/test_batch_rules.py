"""Triton's batch rule for ensembles: a batching step must take every batch the ensemble may be sent."""
from __future__ import annotations

import shutil

import pytest
import tritonclient.http as httpclient
from helpers.ensemble_models import write_ensemble
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException


def test_an_ensemble_batching_more_than_a_step_fails_to_load(ensemble_repo, tmp_path):
    shutil.copytree(ensemble_repo / "simple", tmp_path / "small")
    config = (tmp_path / "small" / "config.pbtxt").read_text()
    (tmp_path / "small" / "config.pbtxt").write_text(
        config.replace('name: "simple"', 'name: "small"').replace("max_batch_size: 8", "max_batch_size: 4"))
    both = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    write_ensemble(tmp_path, "too_wide", [("small", both, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})])  # batch 8
    with ServerProcess([tmp_path], "--model-control-mode", "explicit") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        with pytest.raises(InferenceServerException) as e:
            client.load_model("too_wide")
        assert "ensemble too_wide allows maximum batch size 8, but it contains model small which only allows " \
               "maximum batch size to be 4" in e.value.message()
        assert e.value.message().startswith("failed to load 'too_wide'") and not client.is_model_ready("too_wide")
