"""The Triton matmul on GGUF-quantized weights (kernels/triton_quant.py): compiled on a GPU, else under
TRITON_INTERPRET=1 on CPU tensors in a child pytest (tests/helpers/triton_mode.py); the planes' torch
reference runs in this process.

The bound on |kernel - float64 product of gguf's dequantized weights| at each output, with
S = sum_k |x_k w_k|: the kernel dequantizes with gguf's fp32 operations (exactly: the identity test), so
at fp32 only the fp32 accumulation errs, 1e-5 S (as tests/helpers/quant_check.py states it). In bf16/fp16
the weight tile is rounded to the activation dtype (each product off by at most u S, u = 2^-9 for bf16,
2^-11 for fp16) and the output is rounded once more (u |y| <= u S): 2u S + 1e-5 S + 1e-6 in all.
"""
import numpy as np
import pytest
import torch
from helpers.quant_check import dequantize, make_weight
from helpers.tiny_gguf import VOCAB, tensor_plans, write_tiny
from helpers.triton_mode import DEVICE, INTERPRETED, needs_triton, run_interpreted, runs_the_child

pytest.importorskip("triton")
import gguf

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.kernels import quant_layout
from modelplex_native_gpu.layers import quantized_triton
from modelplex_native_gpu.layers.quantized import QuantizedWeight

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]
UNIT_ROUNDOFF = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -11}


def planes_for(type_name, n, k, seed, device="cpu"):
    data = make_weight(type_name, n, k, seed=seed)
    planes = quant_layout.split_planes(torch.from_numpy(data), int(gguf.GGMLQuantizationType[type_name]), k)
    return planes.map(lambda t: t.to(device)), dequantize(type_name, data, k)


def row_length(type_name):
    """K: 288 for 32-weight blocks (not a multiple of any K tile: the last one is masked), 512 for K-quants."""
    return 512 if type_name.endswith("_K") else 288


@pytest.mark.parametrize("type_name", TYPES)
def test_planes_dequantize_like_gguf(type_name):
    """The planes hold every bit: their torch dequantization (the kernel's index arithmetic) equals gguf's."""
    planes, w = planes_for(type_name, 7, 512, seed=5)
    assert np.array_equal(quant_layout.dequantize(planes).numpy(), w), type_name
    ids = torch.tensor([6, 0, 3])
    assert np.array_equal(quant_layout.dequantize(planes.map(lambda t: t[ids])).numpy(), w[ids.numpy()])


@runs_the_child
def test_kernels_under_the_interpreter():
    """Without a GPU: the `triton` tests of this file, interpreted in a child process."""
    summary = run_interpreted(__file__, "not under_the_interpreter and not cuda_engine and not compiles")
    assert int(summary.split(" passed")[0].split()[-1]) >= 5 * len(TYPES)


@needs_triton
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_triton_quant_matmul_matches_the_float64_product(type_name, dtype):
    from modelplex_native_gpu.kernels.triton_quant import quant_matmul

    k = row_length(type_name)
    planes, w = planes_for(type_name, 72, k, seed=11, device=DEVICE)  # 72: a partial column tile
    w64 = w.astype(np.float64)
    g = torch.Generator().manual_seed(3)
    bias = torch.randn(72, generator=g)
    for m in (1, 3, 17, 70) if dtype == torch.float32 else (1, 3, 17):  # decode sizes; partial and 2 row tiles
        x = torch.randn(m, k, generator=g)
        x[0, :32] *= 30  # a block of larger activations
        x = x.to(dtype)
        xs = x.double().numpy()
        want = xs @ w64.T
        bound = (2 * UNIT_ROUNDOFF[dtype] + 1e-5) * (np.abs(xs) @ np.abs(w64).T) + 1e-6
        with_bias = m == 3
        if with_bias:
            want += bias.to(dtype).double().numpy()
            bound += UNIT_ROUNDOFF[dtype] * np.abs(want)  # the output's rounding of the bias term
        for splits in (None, 3) if m <= 3 else (None,):  # 3: K cut in 3 ranges summed in a second pass
            y = quant_matmul(x.to(DEVICE), planes, bias.to(device=DEVICE, dtype=dtype) if with_bias else None,
                             num_splits=splits)
            assert y.dtype == dtype and y.shape == (m, 72)
            err = np.abs(y.cpu().double().numpy() - want)
            assert (err <= bound).all(), \
                f"{type_name} {dtype} m={m} splits={splits}: error {(err / bound).max():.3f} of the bound"


@needs_triton
@pytest.mark.parametrize("type_name", TYPES)
def test_triton_quant_dequantizes_exactly(type_name):
    """x = I (256 tokens: a prefill's tile sizes) gives W^T: every weight exactly as gguf dequantizes it."""
    from modelplex_native_gpu.kernels.triton_quant import quant_matmul

    planes, w = planes_for(type_name, 40, 256, seed=2, device=DEVICE)
    y = quant_matmul(torch.eye(256, device=DEVICE), planes)
    assert np.array_equal(y.T.cpu().numpy(), w), type_name


@needs_triton
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("type_name", ["Q4_0", "Q6_K"])
def test_triton_quant_writes_only_its_rows_and_columns(type_name, splits):
    """A ragged M and N into a strided view of a larger buffer: nothing outside [M, N] is written; strided
    activation rows are read in place."""
    from modelplex_native_gpu.kernels.triton_quant import quant_matmul

    k = row_length(type_name)
    planes, w = planes_for(type_name, 40, k, seed=4, device=DEVICE)
    wide = torch.randn(19, k + 64, device=DEVICE)
    x = wide[:, 32:32 + k]  # rows strided by k + 64
    buf = torch.full((19 + 5, 40 + 24), float("nan"), device=DEVICE)
    out = buf[2:21, 8:48]
    quant_matmul(x, planes, out=out, num_splits=splits)
    xd, wd = x.cpu().double().numpy(), w.astype(np.float64)
    bound = 1e-5 * (np.abs(xd) @ np.abs(wd).T)  # fp32 accumulation only (the module docstring's bound)
    assert (np.abs(out.cpu().double().numpy() - xd @ wd.T) <= bound).all()
    outside = buf.clone()
    outside[2:21, 8:48] = 0
    assert outside.isnan().sum().item() == buf.numel() - 19 * 40


@pytest.mark.skipif(INTERPRETED or DEVICE == "cuda", reason="interpreted kernels are not compiled; on a GPU the "
                                                            "kernel tests compile them")
def test_the_kernel_compiles_for_sm90_without_a_gpu():
    """The interpreter runs the kernel as Python and so accepts code Triton's compiler refuses: compile each
    type (bf16, the decode tile) and the fp32 and prefill variants to PTX for Hopper, no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from modelplex_native_gpu.kernels import triton_quant

    types = {"Q8_0": 8, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
    decode, prefill = triton_quant._tiles(1), triton_quant._tiles(2048)
    variants = [(qtype, "bf16", decode, 4) for qtype in types.values()]  # 4 K splits, as decode on a GPU
    variants += [(14, "fp32", decode, 1), (12, "fp16", prefill, 1)]
    target = GPUTarget("cuda", 90, 32)
    for qtype, dtype, (block_m, block_n, block_k, num_warps), splits in variants:
        signature = {"x_ptr": f"*{dtype}", "qs_ptr": "*i8" if qtype == 8 else "*u8", "qh_ptr": "*u8",
                     "d_ptr": "*fp16", "dmin_ptr": "*fp16", "sc_ptr": "*i8" if qtype == 14 else "*u8",
                     "mn_ptr": "*u8", "bias_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "partial_ptr": "*fp32",
                     "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_om": "i32", "k_per_split": "i32"}
        constants = {"QTYPE": qtype, "HAS_BIAS": True, "DOT": 0 if dtype == "fp32" else 1, "SPLIT": splits,
                     "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}
        signature.update(dict.fromkeys(constants, "constexpr"))
        compiled = triton.compile(ASTSource(triton_quant._quant_matmul_kernel, signature, constexprs=constants),
                                  target=target, options={"num_warps": num_warps})
        assert ("wgmma" in compiled.asm["ptx"] or "mma.sync" in compiled.asm["ptx"]) == (dtype != "fp32"), qtype
    signature = {"partial_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32",
                 "stride_om": "i32"}
    constants = {"SPLIT": 4, "HAS_BIAS": True, "DOT": 1, "BLOCK_N": 256}
    signature.update(dict.fromkeys(constants, "constexpr"))
    triton.compile(ASTSource(triton_quant._sum_splits_kernel, signature, constexprs=constants), target=target)


def greedy_tokens(path, triton_weights, max_tokens=6):
    """Greedy tokens of the tiny model on CPU: quantized by the compiled CPU ops, or (triton_weights) with
    every quantized weight moved to the Triton path on CPU tensors (the interpreter runs it)."""
    torch.set_num_threads(2)
    with pytest.MonkeyPatch.context() as mp:
        if triton_weights:  # a CUDA engine moves the blocks before the CPU-only repack (pack) would run
            mp.setattr(QuantizedWeight, "repack", lambda self: None)
        e = LLMEngine(EngineConfig(model=path, device="cpu", dtype="float32", quantized_weights=True,
                                   max_model_len=64, kv_cache_memory_bytes=4 << 20, skip_tokenizer_init=True,
                                   enable_prefix_caching=False))
    if triton_weights:
        assert quantized_triton.to_device(e.runner.model, torch.device("cpu")) == 2 * 4 + 1  # q/k/v, o, gate/up, down a layer; the table
        assert isinstance(e.runner.model.embed_tokens, quantized_triton.TritonQuantizedWeight)
        assert e.runner.model.lm_head.quantized is e.runner.model.embed_tokens
        assert e.runner.model.layers[0].self_attn.qkv_proj.quantized.type_names == "Q4_K+Q6_K"
    prompts = [[int(t) for t in np.random.default_rng(s).integers(3, VOCAB, 9)] for s in range(2)]
    outs = e.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    return [o[0].token_ids for o in outs]


@needs_triton
@pytest.mark.skipif(DEVICE == "cuda", reason="the engine check runs the Triton path on CPU tensors")
def test_triton_engine_path_matches_the_cpu_quantized_path(tmp_path):
    """A Q4_K_M-like file (Q4_K, attn_v and ffn_down Q6_K: a fused q/k/v of two types; a Q8_0 table tied to
    the LM head): the same greedy tokens through the Triton path as through the compiled CPU ops."""
    from modelplex_native_gpu.kernels import cpu

    if cpu.compiled_ops() is None:  # the GPU check's dry run does not build them
        pytest.skip("the compiled CPU ops (the path compared with) are not built here")
    plans = tensor_plans("Q4_K")
    for p in plans:
        if p.name.endswith(("attn_v.weight", "ffn_down.weight")):
            p.type_name = "Q6_K"
            p.make = lambda shape=p.shape: make_weight("Q6_K", *shape, seed=7)
    path = write_tiny(tmp_path / "tiny-q4_k_m.gguf", "Q4_K", plans=plans)
    assert greedy_tokens(path, True) == greedy_tokens(path, False)


def cuda_engine(path, dtype, quantized):
    return LLMEngine(EngineConfig(model=path, device="cuda", dtype=dtype, quantized_weights=quantized,
                                  max_model_len=64, kv_cache_memory_bytes=16 << 20, skip_tokenizer_init=True,
                                  enable_prefix_caching=False))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K"])
def test_cuda_engine_keeps_gguf_weights_quantized(tmp_path, type_name):
    """On CUDA the planes replace the blocks (nothing dequantized is held) and fp32 greedy tokens equal those
    of the weights dequantized at load; bf16 (the CUDA default) runs the tensor-core path."""
    path = write_tiny(tmp_path / f"tiny-{type_name}.gguf", type_name)
    prompts = [[int(t) for t in np.random.default_rng(s).integers(3, VOCAB, 9)] for s in range(3)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    quantized, dequantized = cuda_engine(path, "float32", True), cuda_engine(path, "float32", False)
    model = quantized.runner.model
    assert all(isinstance(m.quantized, quantized_triton.TritonQuantizedWeight) for m in model.modules()
               if hasattr(m, "quantized"))
    assert model.embed_tokens.planes[0].qs.is_cuda and model.lm_head.quantized is model.embed_tokens
    assert quantized.runner.weight_bytes < dequantized.runner.weight_bytes / 3
    got = [o[0].token_ids for o in quantized.generate(prompts, params)]
    assert got == [o[0].token_ids for o in dequantized.generate(prompts, params)]
    bf16 = [o[0].token_ids for o in cuda_engine(path, "bfloat16", True).generate(prompts, params)]
    assert [len(t) for t in bf16] == [8] * 3
