"""The PyTorch backend tests' repository: good and broken models side by side, built once per session
(the torch.export program takes seconds to trace), so one server start covers every case."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def pytorch_repo(tmp_path_factory) -> Path:
    from build_repository import SIMPLE_PYTORCH_CONFIG, build
    from helpers.pytorch_models import (
        BATCHED,
        MODES_CONFIG,
        SCALED_CONFIG,
        SIMPLE,
        Modes,
        Scaled,
        parameter,
        save_exported,
        save_torchscript,
        scaled_example,
        write_model,
    )

    repo = tmp_path_factory.mktemp("pytorch_repo")
    build(repo, [SIMPLE])
    simple_model = repo / SIMPLE / "1" / "model.pt"
    copy_simple = lambda path: path.write_bytes(simple_model.read_bytes())
    write_model(repo, BATCHED, SIMPLE_PYTORCH_CONFIG.replace(f'"{SIMPLE}"', f'"{BATCHED}"')
                + "dynamic_batching { max_queue_delay_microseconds: 300000 }\n", copy_simple)
    write_model(repo, "scaled", SCALED_CONFIG, save_torchscript(Scaled()))
    # Only the backend named: inputs, outputs, dims and batching come from the program's signature.
    write_model(repo, "exported", 'backend: "pytorch"\n', save_exported(Scaled(), scaled_example()), "model.pt2")
    write_model(repo, "modes", MODES_CONFIG, save_torchscript(Modes()))
    write_model(repo, "modes_no_inference", MODES_CONFIG + parameter("INFERENCE_MODE", "false")
                + parameter("DISABLE_OPTIMIZED_EXECUTION", "true") + parameter("INTRA_OP_THREAD_COUNT", "1"),
                save_torchscript(Modes()))
    # Broken: each fails its own load with the reason; the models above keep serving.
    simple_config = SIMPLE_PYTORCH_CONFIG.replace(f'name: "{SIMPLE}"\n', "")
    write_model(repo, "missing_file", simple_config)
    write_model(repo, "wrong_input_count", simple_config.replace(
        "input [\n", 'input [\n  { name: "INPUT__2" data_type: TYPE_INT32 dims: [ 16 ] },\n'), copy_simple)
    write_model(repo, "bytes_input", simple_config.replace(
        'name: "INPUT__1" data_type: TYPE_INT32', 'name: "INPUT__1" data_type: TYPE_STRING'), copy_simple)
    write_model(repo, "torchscript_without_config", 'backend: "pytorch"\n', copy_simple)
    write_model(repo, "bad_parameter", MODES_CONFIG + parameter("INFERENCE_MODE", "maybe"),
                save_torchscript(Modes()))
    write_model(repo, "gpu_instance", simple_config + "instance_group [ { kind: KIND_GPU } ]\n", copy_simple)
    return repo


@pytest.fixture(scope="module")
def server(pytorch_repo):
    from helpers.serverproc import ServerProcess

    with ServerProcess([pytorch_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--exit-on-error=false") as s:  # the broken models stay UNAVAILABLE
        yield s
