"""Steps on dense weights packed for our fp32 and bf16 linears (SmolLM2-135M) through csrc/dense_layer.cpp (all of
a step's layers in one op call, or one call a layer) give bit for bit the hidden states of the Python layers'
op-by-op path: prefills, then decodes of one sequence, three or 64 together (the decode-only steps in one
parallel region, csrc/dense_decode_step.cpp), and steps that mix a prefill chunk with decodes (returning only the
rows that sample, the last layer run for those alone); on one thread and two."""
import numpy as np
import pytest
import torch

from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.models.llama import LlamaDecoderLayer, LlamaForCausalLM


def counted(ops, calls, name):
    op = getattr(ops, name)

    def call(*args):
        calls.append(1)
        return op(*args)
    return call


@pytest.fixture(params=["float32", "bfloat16"])
def dtype(request, ops):
    if request.param == "bfloat16" and not hasattr(ops, "packed_linear_bf16"):
        pytest.skip("the bf16 linears are built where the CPU has AVX512_BF16")
    return request.param


@pytest.mark.parametrize("threads", [1, 2])
def test_the_one_call_dense_step_and_layer_equal_the_layer_op_by_op(make_engine, ops, dtype, threads,
                                                                        monkeypatch):
    # a 16-token budget: the 20-token prompt's second chunk runs beside the other two's first decodes
    e = make_engine(dtype=dtype, max_num_batched_tokens=16, enable_prefix_caching=False)
    torch.set_num_threads(threads)
    model = e.runner.model
    assert all(layer.dense_weights() is not None for layer in model.layers)
    assert model.layers[0].dense_weights()[0][0].dtype == getattr(torch, dtype)
    step_calls, layer_calls = [], []
    monkeypatch.setattr(model.fused_ops, "dense_layers", counted(ops, step_calls, "dense_layers"), raising=False)
    monkeypatch.setattr(model.fused_ops, "dense_layer", counted(ops, layer_calls, "dense_layer"), raising=False)
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, 40000, n)] for n in (12, 7, 20)]

    def hidden_states(every_row=False, ask_all_rows=False):
        """Each step's hidden states, its decode rows and the rows it samples; with every_row, the model is
        not told which rows sample (as at prompt logprobs), so it returns them all; with ask_all_rows, it is
        asked for every row (a layout the last layer cannot cut: it runs whole and selects them after)."""
        captured, num_decodes, sampled, num_chunks = [], [], [], []
        forward = model.forward

        def capture(input_ids, positions, metas):
            sampled.append(metas[0].sample_rows.clone())
            num_chunks.append(len(metas[0].prefill_context_lens))
            if every_row:
                metas[0].sample_rows = None
            if ask_all_rows:
                metas[0].sample_rows = torch.arange(len(input_ids))
            captured.append(forward(input_ids, positions, metas))
            num_decodes.append(metas[0].num_decode_tokens)
            return captured[-1]
        model.forward = capture
        try:
            for batch in (prompts[:1], prompts):
                e.generate(batch, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        finally:
            del model.forward
        return captured, num_decodes, sampled, num_chunks

    regions = ops.dense_decode_steps()
    whole_step, num_decodes, sampled, num_chunks = hidden_states(every_row=True)
    steps = len(whole_step)
    mixed = [i for i, (h, nd) in enumerate(zip(whole_step, num_decodes)) if 0 < nd < h.shape[0]]
    assert num_decodes.count(0) >= 2 and mixed and num_decodes.count(1) >= 5, num_decodes
    # a step with decode rows and a prefill chunk that does not end its prompt (no row of it samples)
    assert any(len(sampled[i]) < num_decodes[i] + num_chunks[i] for i in mixed), (sampled, num_chunks)
    decode_only = sum(nd == h.shape[0] for h, nd in zip(whole_step, num_decodes))
    assert ops.dense_decode_steps() - regions == decode_only >= 6
    assert len(step_calls) == steps and not layer_calls
    cut = ops.dense_cut_steps()
    sample_rows_only, _, _, _ = hidden_states()
    # every step with prefill rows ran its last layer for the sample rows alone
    assert ops.dense_cut_steps() - cut == steps - decode_only
    cut = ops.dense_cut_steps()
    all_rows_asked, _, _, _ = hidden_states(ask_all_rows=True)
    assert ops.dense_cut_steps() == cut  # every row asked: the last layer runs whole
    monkeypatch.setattr(LlamaForCausalLM, "_dense_step_weights", lambda self, ropes: None)
    per_layer, _, _, _ = hidden_states()
    assert len(layer_calls) == steps * len(model.layers)
    monkeypatch.setattr(LlamaDecoderLayer, "dense_weights", lambda self: None)
    op_by_op, _, _, _ = hidden_states()
    assert len(step_calls) == 3 * steps and len(layer_calls) == steps * len(model.layers)
    assert len(sample_rows_only) == len(all_rows_asked) == len(per_layer) == len(op_by_op) == steps
    for i, (a, s, b, c, rows) in enumerate(zip(whole_step, sample_rows_only, per_layer, op_by_op, sampled)):
        assert a.dtype == c.dtype == getattr(torch, dtype)
        assert torch.equal(a, c) and torch.equal(b, c) and torch.equal(all_rows_asked[i], c), f"step {i}"
        # steps with prefill rows return only the rows that sample, their last layer run for those alone
        expected = c if num_decodes[i] == c.shape[0] else c[rows]
        assert torch.equal(s, expected), f"step {i}: sample rows {rows.tolist()} of {c.shape[0]}"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_64_sequence_decode_step_in_one_region_equals_the_layer_op_by_op(make_engine, ops, dtype, threads,
                                                                           monkeypatch):
    e = make_engine(dtype=dtype, kv_cache_memory_bytes=128 << 20)
    torch.set_num_threads(threads)
    model = e.runner.model
    rng = np.random.default_rng(2)
    prompts = [[int(t) for t in rng.integers(3, 40000, int(n))] for n in rng.integers(2, 5, 64)]

    def hidden_states():
        captured = []
        forward = model.forward

        def capture(input_ids, positions, metas):
            captured.append((forward(input_ids, positions, metas), metas[0].num_decode_tokens,
                             metas[0].sample_rows.clone()))
            return captured[-1][0]
        model.forward = capture
        try:
            e.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        finally:
            del model.forward
        return captured

    regions = ops.dense_decode_steps()
    region = hidden_states()
    assert [nd for h, nd, _ in region if nd == h.shape[0]] == [64, 64], [(h.shape[0], nd) for h, nd, _ in region]
    assert ops.dense_decode_steps() - regions == 2
    monkeypatch.setattr(LlamaForCausalLM, "_dense_step_weights", lambda self, ropes: None)
    monkeypatch.setattr(LlamaDecoderLayer, "dense_weights", lambda self: None)
    op_by_op = hidden_states()
    assert ops.dense_decode_steps() - regions == 2 and len(op_by_op) == len(region)
    for i, ((a, _, rows), (b, nd, _)) in enumerate(zip(region, op_by_op)):
        assert a.dtype == b.dtype == getattr(torch, dtype)
        assert torch.equal(a, b if nd == b.shape[0] else b[rows]), f"step {i}"  # prefills: their sample rows
