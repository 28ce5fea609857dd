"""The quantized linear ops (kernels/csrc/quant_linear.cpp, quant_gemm.cpp) against gguf's dequantization and a
float64 product: shared by the in-process tests and the other ISA builds, which run in child processes.

The bound on a quantized linear's error. Each token's activations go to int16 in blocks b of 32 with
scale d_b = max|x| / 32767: q = round(x / d_b), so each activation moves by at most d_b / 2 (a relative
~1e-5 more from fp32 arithmetic). The output y = sum_i w_i x_i therefore moves by at most
    E = sum_b d_b / 2 * sum_{i in b} |w_i|     (w: the dequantized weights)
plus fp32 accumulation, bounded by 1e-5 * sum_i |w_i x_i|. The test checks |y - y_float64| <= 1.01 E +
1e-5 sum |w x| + 1e-6 at every output; typical errors are far smaller (errors of independent signs add
as sqrt, not linearly). int8 activations (llama.cpp's Q8_0 activations, d_b = max|x| / 127) would
move each activation by up to 258x more. K-quants multiply unquantized fp32 activations: E = 0.

quant_gemm (every type, from quant_gemm_min_tokens tokens on) multiplies the dequantized fp32 weights with the
fp32 activations, one FMA chain over k a output: |y - y_float64| <= gamma_K sum |w x|, gamma_K = K u / (1 - K u),
u = 2^-24 (the classic bound for recursive summation, which an FMA chain meets with one rounding a step).
"""
import numpy as np
import torch

INT8_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")


def make_weight(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """[n, row bytes] uint8 blocks: gguf.quants.quantize of Gaussian weights, or (K-quants, which gguf
    cannot quantize) random codes with sane fp16 scales."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    rng = np.random.default_rng(seed)
    if type_name in INT8_TYPES:
        return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, qtype)
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n * k // block, nbytes), dtype=np.uint8)
    scales = rng.uniform(1e-4, 2e-3, (n * k // block, 2)).astype(np.float16).view(np.uint8)
    if type_name == "Q6_K":
        blocks[:, 208:210] = scales[:, 0:2]
    else:
        blocks[:, 0:4] = scales
    return blocks.reshape(n, -1)


def dequantize(type_name: str, data: np.ndarray, k: int) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[type_name]).reshape(data.shape[0], k)


def error_bound(type_name: str, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[m, n] bound on |quantized linear - float64 product| (the module docstring derives it)."""
    ax, aw = np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64))
    fp32 = 1e-5 * ax @ aw.T + 1e-6
    if type_name in K_TYPES:
        return fp32
    m, k = x.shape
    d = ax.reshape(m, k // 32, 32).max(axis=2) / 32767  # [m, blocks]
    wsum = aw.reshape(w.shape[0], k // 32, 32).sum(axis=2)  # [n, blocks]
    return 1.01 / 2 * d @ wsum.T + fp32


def gemm_bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[m, n] bound on |quant_gemm - float64 product| (the module docstring)."""
    ku = w.shape[1] * 2.0 ** -24
    return ku / (1 - ku) * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T) + 1e-30


# Layouts the weights are repacked into at load (kernels/csrc/quant_repack.cpp): name -> (GGML type, number)
REPACKED = {"Q4_0x16": ("Q4_0", 1002), "Q4_1x16": ("Q4_1", 1003), "Q8_0x16": ("Q8_0", 1008)}


def check_ops(ops, types=INT8_TYPES + K_TYPES + tuple(REPACKED)):
    """Dequantization equals gguf's bit for bit; outputs within the bound of the kernel quant_linear picks for
    the batch size; on each side of quant_gemm_min_tokens a token's outputs do not depend on the batch.
    Shapes: a partial last row tile (7, 66 rows), one row, several token tiles, more tokens than an L2 token
    block (70); a repacked layout also whole 16-row groups only (48) and groups beside a tail of rows left in
    the file's layout (66 = 4 x 16 + 2; 7 and 1 are tails only)."""
    import gguf

    worst = {}
    for type_name in types:
        file_type, repacked = REPACKED.get(type_name, (type_name, None))
        qtype = repacked or int(gguf.GGMLQuantizationType[file_type])
        for n, k in [(66, 256), (7, 512), (1, 256)] + ([(48, 96)] if repacked else []):
            data = make_weight(file_type, n, k, seed=n + k)
            w = dequantize(file_type, data, k)
            t = torch.from_numpy(data)
            if repacked:
                t = t.clone()
                ops.quant_repack_(t, int(gguf.GGMLQuantizationType[file_type]), repacked)
            got = ops.quant_dequantize(t, qtype, k, None).numpy()
            assert np.array_equal(got, w), f"{type_name}: dequantization differs from gguf's"
            ids = torch.tensor([n - 1, 0, n // 2])
            assert np.array_equal(ops.quant_dequantize(t, qtype, k, ids).numpy(), w[ids.numpy()])
            g = torch.Generator().manual_seed(n * k)
            bias = torch.randn(n, generator=g)
            for m in (1, 2, 3, 5, 70):
                x = torch.randn(m, k, generator=g)
                x[0, :32] *= 100  # a block of larger activations
                want = x.double().numpy() @ w.astype(np.float64).T
                y = ops.quant_linear(x, t, qtype, None)
                err = np.abs(y.double().numpy() - want)
                gemm = m >= ops.quant_gemm_min_tokens(qtype)
                bound = gemm_bound(w, x.numpy()) if gemm else error_bound(file_type, w, x.numpy())
                assert (err <= bound).all(), f"{type_name} n={n} k={k} m={m}: error {(err / bound).max():.3f} of the bound"
                worst[type_name] = max(worst.get(type_name, 0.0), float((err / bound).max()))
                yb = ops.quant_linear(x, t, qtype, bias)
                assert torch.equal(yb, y + bias), f"{type_name}: bias"
                alone = ops.quant_gemm if gemm else ops.quant_linear  # one token, the same kernel
                for row in {0, m // 2, m - 1}:
                    single = alone(x[row:row + 1].clone(), t, qtype, None)[0]
                    assert torch.equal(single, y[row]), f"{type_name} m={m}: token {row} depends on its batch"
    return worst


def check_gemm(ops, types=INT8_TYPES + K_TYPES):
    """quant_gemm is, bit for bit, linear.cpp's packed_linear on gguf's dequantized weights (so its
    dequantization is gguf's), within gemm_bound of the float64 product, and a token's outputs do not depend
    on the tokens batched with it. Shapes: ragged rows (37: one group of 32 and a partial tile of 5; 8: one
    tile), K not a multiple of a token panel's width (96), token counts around the 32-wide panels and their
    16-wide tail (2, 17, 64, 200). Returns the worst error / bound per type."""
    import gguf

    worst = {}
    for type_name in types:
        qtype = int(gguf.GGMLQuantizationType[type_name])
        k = 512 if type_name in K_TYPES else 96
        for n in (37, 8):
            data = make_weight(type_name, n, k, seed=3 * n + k)
            w = dequantize(type_name, data, k)
            t = torch.from_numpy(data)
            packed = ops.pack_linear_weight(torch.from_numpy(w.copy()))
            g = torch.Generator().manual_seed(n + k)
            bias = torch.randn(n, generator=g)
            for m in (2, 17, 64, 200):
                x = torch.randn(m, k, generator=g)
                x[0, :32] *= 100
                y = ops.quant_gemm(x, t, qtype, bias)
                assert torch.equal(y, ops.packed_linear(x, packed, n, bias)), f"{type_name} n={n} m={m}: not packed_linear's"
                y = ops.quant_gemm(x, t, qtype, None)
                err = np.abs(y.double().numpy() - x.double().numpy() @ w.astype(np.float64).T)
                bound = gemm_bound(w, x.numpy())
                assert (err <= bound).all(), f"{type_name} n={n} m={m}: error {(err / bound).max():.3f} of the bound"
                worst[type_name] = max(worst.get(type_name, 0.0), float((err / bound).max()))
                for row in {0, m // 2, m - 1}:
                    single = ops.quant_gemm(x[row:row + 1].clone(), t, qtype, None)[0]
                    assert torch.equal(single, y[row]), f"{type_name} m={m}: token {row} depends on its batch"
                if m >= ops.quant_gemm_min_tokens(qtype):
                    assert torch.equal(ops.quant_linear(x, t, qtype, None), y), f"{type_name} m={m}: not dispatched"
    return worst
