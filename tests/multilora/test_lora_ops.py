"""Batched LoRA shrink/expand: the torch ops and the CPU path (oneDNN-packed) against a per-token loop,
and the Triton kernels against the torch ops: compiled on a GPU, else under TRITON_INTERPRET=1 on CPU
tensors in a child pytest (tests/helpers/triton_mode.py)."""
import pytest
import torch
from helpers.triton_mode import DEVICE, needs_triton, run_interpreted, runs_the_child

from modelplex_multilora.mapping import LoRAMapping
from modelplex_multilora.ops import cpu, reference

IN, OUTS = 40, (24, 8, 8)  # a fused projection of three slices, non-power-of-two sizes


def stacks(num_slots, rank, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lora_a = torch.randn(num_slots, len(OUTS), rank, IN, generator=g).to(dtype)
    lora_b = tuple(torch.randn(num_slots, rank, out, generator=g).to(dtype) for out in OUTS)
    return lora_a, lora_b


def per_token(x, y, lora_a, lora_b, token_slots):
    """What the ops must compute, one token and one slice at a time."""
    want = y.clone()
    for t, slot in enumerate(token_slots.tolist()):
        if slot < 0:
            continue
        offset = 0
        for i, b in enumerate(lora_b):
            want[t, offset:offset + b.shape[-1]] += (x[t] @ lora_a[slot, i].T) @ b[slot]
            offset += b.shape[-1]
    return want


def mapping_for(request_slots, tokens, dtype=torch.float32, device="cpu"):
    return LoRAMapping.build(request_slots, tokens, dtype, torch.device(device))


@pytest.mark.parametrize("ops", [reference, cpu], ids=["reference", "cpu"])
@pytest.mark.parametrize("rank", [8, 5])
@pytest.mark.parametrize("request_slots,tokens", [([-1, 0, 2, 1, -1], [3, 1, 2, 1, 4]), ([1, 1, -1], [3, 1, 2]),
                                                  ([0], [3]), ([2, -1, 0, 2], [9, 2, 1, 4]), ([2], [1])],
                         ids=["mixed", "prefix", "one", "uneven", "last-slot"])
def test_ops_match_a_per_token_loop(ops, rank, request_slots, tokens):
    """"uneven": one slot's prefill spans several of the CPU ops' pieces; "last-slot": slots 0 and 1 are empty."""
    lora_a, lora_b = stacks(3, rank)
    mapping = mapping_for(request_slots, tokens)
    assert mapping.num_slots == max(request_slots) + 1
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(sum(tokens), IN, generator=g), torch.randn(sum(tokens), sum(OUTS), generator=g)
    want = per_token(x, y, lora_a, lora_b, mapping.token_slots)
    ops.lora_expand(y, ops.lora_shrink(x, lora_a, mapping), lora_b, mapping)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5, msg="torch LoRA ops vs per-token loop")


def test_cpu_ops_skip_the_ranks_beyond_the_steps_adapters():
    """Stacks of rank 8 in LoRALinear's rank-major layout, adapters of rank <= 5: the CPU ops multiply by the
    first 5 ranks only (mapping.max_rank) and give the per-token loop's answer."""
    g = torch.Generator().manual_seed(3)
    lora_a = torch.zeros(3, 8, len(OUTS), IN).transpose(1, 2)
    lora_b = tuple(torch.zeros(3, 8, out) for out in OUTS)
    lora_a[:, :, :5] = torch.randn(3, len(OUTS), 5, IN, generator=g)
    for b in lora_b:
        b[:, :5] = torch.randn(3, 5, b.shape[-1], generator=g)
    mapping = LoRAMapping.build([0, -1, 2], [2, 1, 3], torch.float32, torch.device("cpu"), max_rank=5)
    x, y = torch.randn(6, IN, generator=g), torch.randn(6, sum(OUTS), generator=g)
    want = per_token(x, y, lora_a, lora_b, mapping.token_slots)
    s = cpu.lora_shrink(x, lora_a, mapping)
    assert s.shape[-1] == 5
    cpu.lora_expand(y, s, lora_b, mapping)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5, msg="rank-trimmed CPU ops vs per-token loop")


def test_cpu_ops_follow_slot_rewrites_and_slot_counts():
    """The packed copies must not go stale: a slot rewritten in place, or a step using more slots."""
    lora_a, lora_b = stacks(3, 8)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, IN, generator=g)

    def run(request_slots, tokens):
        mapping = mapping_for(request_slots, tokens)
        y = torch.zeros(sum(tokens), sum(OUTS))
        cpu.lora_expand(y, cpu.lora_shrink(x[:sum(tokens)], lora_a, mapping), lora_b, mapping)
        return y, per_token(x[:sum(tokens)], torch.zeros_like(y), lora_a, lora_b, mapping.token_slots)

    torch.testing.assert_close(*run([0, 1], [2, 2]))
    lora_a[1].copy_(torch.randn(lora_a[1].shape, generator=g))  # the manager loads another adapter into slot 1
    lora_b[0][1].zero_()
    torch.testing.assert_close(*run([0, 1], [2, 2]))
    torch.testing.assert_close(*run([2, 0], [1, 3]))  # three slots now


def test_no_adapter_in_the_step_means_no_mapping():
    assert mapping_for([-1, -1], [3, 1]) is None


@runs_the_child
def test_kernels_under_the_interpreter():
    """Without a GPU: the `triton` tests of this file, interpreted in a child process."""
    run_interpreted(__file__, "triton")


@needs_triton
@pytest.mark.parametrize("rank", [8, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_match_the_reference(rank, dtype):
    pytest.importorskip("triton")
    from modelplex_multilora.ops import triton_lora

    lora_a, lora_b = stacks(4, rank, dtype=dtype)
    lora_a, lora_b = lora_a.to(DEVICE), tuple(b.to(DEVICE) for b in lora_b)
    mapping = mapping_for([2, -1, 0, 3, 0], [1, 2, 3, 1, 1], dtype, DEVICE)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, IN, generator=g).to(DEVICE, dtype)
    y = torch.randn(8, sum(OUTS), generator=g).to(DEVICE, dtype)
    s_ref = reference.lora_shrink(x, lora_a, mapping)
    s_tri = triton_lora.lora_shrink(x, lora_a, mapping)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-1)
    torch.testing.assert_close(s_tri, s_ref, **tol, msg="shrink: triton vs torch")
    y_ref, y_tri = y.clone(), y.clone()
    reference.lora_expand(y_ref, s_ref, lora_b, mapping)
    triton_lora.lora_expand(y_tri, s_ref, lora_b, mapping)
    torch.testing.assert_close(y_tri, y_ref, **tol, msg="expand: triton vs torch")
    assert torch.equal(y_tri[1:3], y[1:3])  # tokens without an adapter are untouched
