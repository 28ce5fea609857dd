"""The model-config rules Triton applies to every backend (models/config_rules.py): each broken config
fails its load through the real client with the rule named, and the server keeps serving."""
from __future__ import annotations

import shutil

import pytest
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

# name -> (what is added to simple's config, the words of the load error)
BROKEN = {
    "cpu_with_gpus": ('instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]',
                      "instance group cpu_with_gpus_0 of model cpu_with_gpus has kind KIND_CPU but specifies one or "
                      "more GPUs"),
    "preferred_too_big": ("dynamic_batching { preferred_batch_size: [ 16 ] }",
                          "dynamic batching preferred size must be <= max batch size for preferred_too_big"),
    "ordered_priorities": ("dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
                           "Only one priority level is allowed when 'preserve_ordering' is true for ordered_priorities"),
    "ordered_delay": ("dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY "
                      "default_timeout_microseconds: 100 } }",
                      "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"),
    "batch_input_two_sources": ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 '
                                'source_input: [ "INPUT0", "INPUT1" ] } ]',
                                "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2"),
    "batch_input_fp16": ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP16 '
                         'source_input: [ "INPUT0" ] } ]', "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    "batch_input_unknown_source": ('batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT32 '
                                   'source_input: [ "NOPE" ] } ]', "unknown source input name 'NOPE'"),
    "batch_output_unknown_target": ('batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: [ "NOPE" ] '
                                    'source_input: [ "INPUT0" ] } ]', "unknown target output name 'NOPE'"),
}


@pytest.fixture(scope="module")
def server(example_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("rules")
    shutil.copytree(example_repo / "simple", repo / "simple")
    config = (example_repo / "simple" / "config.pbtxt").read_text()
    for name, (extra, _) in BROKEN.items():
        shutil.copytree(example_repo / "simple", repo / name)
        (repo / name / "config.pbtxt").write_text(config.replace('name: "simple"', f'name: "{name}"') + extra + "\n")
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "simple") as s:
        yield s


@pytest.mark.parametrize("model", BROKEN)
def test_a_config_breaking_a_rule_fails_its_load_naming_it(server, model):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model(model)
    assert e.value.status() == "400"
    assert e.value.message().startswith(f"failed to load '{model}'") and BROKEN[model][1] in e.value.message()
    assert not client.is_model_ready(model) and client.is_model_ready("simple")
