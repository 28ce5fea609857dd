"""The modelplex `native_gpu` backend in-process: config parameters, the generate contract, bad input."""
import asyncio
import os

import pytest

modelplex = pytest.importorskip("modelplex")
from modelplex import GenerateInputs, InstanceContext, InvalidInput, ModelContext  # noqa: E402
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


def inputs(text, sampling=None, rid="q") -> GenerateInputs:
    return GenerateInputs(text, None, dict(sampling or {}), request_id=rid)


def test_backend_spec_and_auto_complete(tmp_path, gguf_path):
    (spec,) = plugin.modelplex_backends()
    assert spec.name == "native_gpu" and spec.max_concurrency_per_instance > 1
    ictx = context(tmp_path, gguf_path)
    spec.auto_complete_config(ictx.model)
    assert [t.name for t in ictx.model.config.input] == ["text_input", "messages", "sampling_parameters"]
    assert [t.name for t in ictx.model.config.output] == ["text_output"]


def test_generate_and_errors(tmp_path, gguf_path):
    (spec,) = plugin.modelplex_backends()
    instance = spec.create_instance(context(tmp_path, gguf_path))
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    greedy = {"temperature": 0, "max_tokens": 24}

    async def chunks(sampling):
        return [c async for c in instance.generate(inputs(prompt, sampling))]

    async def main():
        whole, other = await asyncio.gather(chunks(greedy), chunks({**greedy, "max_tokens": 3}))
        with pytest.raises(InvalidInput, match="top_p"):
            await chunks({"top_p": 0})
        with pytest.raises(InvalidInput, match="nonsense"):
            await chunks({"nonsense": 1})
        await instance.close()
        return whole, other

    whole, other = asyncio.run(main())
    assert "".join(c.text for c in whole) == "The capital of France is Paris." and len(whole) > 2
    assert sum(len(c.token_ids) for c in whole) == 8 and all(c.finish_reason is None for c in whole[:-1])
    assert (whole[-1].finish_reason, whole[-1].num_prompt_tokens, whole[-1].num_output_tokens) == ("stop", 16, 8)
    assert (other[-1].finish_reason, other[-1].num_prompt_tokens, other[-1].num_output_tokens) == ("length", 16, 3)
    assert whole[0].phases is not None and [p[0] for p in whole[0].phases] == ["engine queue", "prefill"]


def test_unknown_parameter_is_rejected(tmp_path, gguf_path):
    bad = CONFIG.replace('"dtype"', '"dtyp"')
    with pytest.raises(InvalidInput, match="unknown parameter 'dtyp'"):
        plugin.modelplex_backends()[0].create_instance(context(tmp_path, gguf_path, bad))


def test_bad_dtype_value_is_rejected_naming_the_field(tmp_path, gguf_path):
    bad = CONFIG.replace('string_value: "float32"', 'string_value: "int3"')
    with pytest.raises(InvalidInput, match="dtype.*int3"):
        plugin.modelplex_backends()[0].create_instance(context(tmp_path, gguf_path, bad))
