"""Decode steps on dense weights packed for our fp32 and bf16 linears (SmolLM2-135M) through csrc/dense_decode.cpp
(all of a step's layers in one op call, or one call a layer) give bit for bit the hidden states of the Python
layers' op-by-op path, one sequence or three decoding together, on one thread and two."""
import numpy as np
import pytest
import torch

from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.models.llama import LlamaDecoderLayer, LlamaForCausalLM

NUM_STEPS = 6  # per generate: the first a prefill, the rest decodes


def counted(ops, calls, name):
    op = getattr(ops, name)

    def call(*args):
        calls.append(1)
        return op(*args)
    return call


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_one_call_dense_decode_step_and_layer_equal_the_layer_op_by_op(make_engine, ops, dtype, threads,
                                                                        monkeypatch):
    if dtype == "bfloat16" and not hasattr(ops, "packed_linear_bf16"):
        pytest.skip("the bf16 linears are built where the CPU has AVX512_BF16")
    e = make_engine(dtype=dtype, max_num_batched_tokens=64, enable_prefix_caching=False)
    torch.set_num_threads(threads)
    model = e.runner.model
    assert all(layer.dense_decode_weights() is not None for layer in model.layers)
    assert model.layers[0].dense_decode_weights()[0][0].dtype == getattr(torch, dtype)
    step_calls, layer_calls = [], []
    monkeypatch.setattr(model.fused_ops, "dense_decode_layers", counted(ops, step_calls, "dense_decode_layers"),
                        raising=False)
    monkeypatch.setattr(model.fused_ops, "dense_decode_layer", counted(ops, layer_calls, "dense_decode_layer"),
                        raising=False)
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, 40000, n)] for n in (12, 7, 20)]

    def hidden_states():
        captured = []
        forward = model.forward
        model.forward = lambda *a, **k: captured.append(forward(*a, **k)) or captured[-1]
        try:
            for batch in (prompts[:1], prompts):
                e.generate(batch, SamplingParams(temperature=0, max_tokens=NUM_STEPS, ignore_eos=True))
        finally:
            del model.forward
        return captured

    decodes = 2 * (NUM_STEPS - 1)
    whole_step = hidden_states()
    assert len(step_calls) == decodes and not layer_calls
    monkeypatch.setattr(LlamaForCausalLM, "_dense_step_weights", lambda self, ropes: None)
    per_layer = hidden_states()
    assert len(layer_calls) == decodes * len(model.layers)
    monkeypatch.setattr(LlamaDecoderLayer, "dense_decode_weights", lambda self: None)
    op_by_op = hidden_states()
    assert len(step_calls) == decodes and len(layer_calls) == decodes * len(model.layers)
    assert len(whole_step) == len(per_layer) == len(op_by_op) == 2 * NUM_STEPS
    for i, (a, b, c) in enumerate(zip(whole_step, per_layer, op_by_op)):
        assert a.dtype == c.dtype == getattr(torch, dtype)
        assert torch.equal(a, c) and torch.equal(b, c), f"step {i}"
