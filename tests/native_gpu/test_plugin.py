"""The modelplex `native_gpu` backend in-process: config parameters, execute, stream, bad input."""
import asyncio
import json
import os

import numpy as np
import pytest

modelplex = pytest.importorskip("modelplex")
from modelplex import InferRequest, InferTensor, InstanceContext, InvalidInput, ModelContext  # noqa: E402
from modelplex.models.config import parse_pbtxt  # noqa: E402
from modelplex_native_gpu import plugin  # noqa: E402

CONFIG = """
backend: "native_gpu"
model_transaction_policy { decoupled: true }
parameters [ { key: "dtype" value: { string_value: "float32" } },
             { key: "max_model_len" value: { string_value: "512" } },
             { key: "kv_cache_memory_bytes" value: { string_value: "67108864" } } ]
"""


def context(tmp_path, gguf_path, config_text=CONFIG) -> InstanceContext:
    (tmp_path / "llm" / "1").mkdir(parents=True)
    os.symlink(gguf_path, tmp_path / "llm" / "1" / "model.gguf")
    config = parse_pbtxt(config_text)
    config.name, config.default_model_filename = "llm", "model.gguf"
    model = ModelContext("llm", 1, tmp_path / "llm", tmp_path / "llm" / "1", config,
                         {k: p.string_value for k, p in config.parameters.items()})
    return InstanceContext(model, "llm_0", 0, "CPU")


def request(text, params=None, rid="q"):
    inputs = [InferTensor.from_numpy("text_input", np.array([text.encode()], dtype=np.object_))]
    if params is not None:
        inputs.append(InferTensor.from_numpy("sampling_parameters", np.array([json.dumps(params).encode()],
                                                                             dtype=np.object_)))
    return InferRequest("llm", inputs, id=rid)


def test_backend_spec_and_auto_complete(tmp_path, gguf_path):
    (spec,) = plugin.modelplex_backends()
    assert spec.name == "native_gpu" and spec.max_concurrency_per_instance > 1
    ictx = context(tmp_path, gguf_path)
    spec.auto_complete_config(ictx.model)
    assert [t.name for t in ictx.model.config.input] == ["text_input", "messages", "sampling_parameters"]
    assert [t.name for t in ictx.model.config.output] == ["text_output"]


def test_execute_stream_and_errors(tmp_path, gguf_path):
    (spec,) = plugin.modelplex_backends()
    instance = spec.create_instance(context(tmp_path, gguf_path))
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    greedy = {"temperature": 0, "max_tokens": 24}

    async def main():
        (whole, other) = await instance.execute([request(prompt, greedy), request(prompt, {**greedy, "max_tokens": 3})])
        parts = [r async for r in instance.stream(request(prompt, greedy))]
        with pytest.raises(InvalidInput, match="top_p"):
            await instance.execute([request(prompt, {"top_p": 0})])
        with pytest.raises(InvalidInput, match="nonsense"):
            await instance.execute([request(prompt, {"nonsense": 1})])
        await instance.close()
        return whole, other, parts

    whole, other, parts = asyncio.run(main())
    assert whole.outputs[0].data[0] == b"The capital of France is Paris."
    assert whole.parameters == {"finish_reason": "stop", "num_input_tokens": 16, "num_output_tokens": 8}
    assert other.parameters == {"finish_reason": "length", "num_input_tokens": 16, "num_output_tokens": 3}
    assert b"".join(p.outputs[0].data[0] for p in parts) == b"The capital of France is Paris." and len(parts) > 2


def test_unknown_parameter_is_rejected(tmp_path, gguf_path):
    bad = CONFIG.replace('"dtype"', '"dtyp"')
    with pytest.raises(InvalidInput, match="unknown parameter 'dtyp'"):
        plugin.modelplex_backends()[0].create_instance(context(tmp_path, gguf_path, bad))


def test_bad_dtype_value_is_rejected_naming_the_field(tmp_path, gguf_path):
    bad = CONFIG.replace('string_value: "float32"', 'string_value: "int3"')
    with pytest.raises(InvalidInput, match="dtype.*int3"):
        plugin.modelplex_backends()[0].create_instance(context(tmp_path, gguf_path, bad))
