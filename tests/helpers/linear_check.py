"""The fp32 packed linear ops (kernels/csrc/linear.cpp) against torch: shared by the in-process test
and the other ISA builds, which run in child processes."""
import torch


def check_against_torch(ops):
    """Shapes cover a partial last panel (1000, 7 columns), K not a multiple of a register, a tile of
    fewer than its rows, several tiles, and more tokens than one L2 row block."""
    for n, k in [(960, 576), (1000, 576), (7, 100), (576, 1536)]:
        g = torch.Generator().manual_seed(n + k)
        weight, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        packed = ops.pack_linear_weight(weight)
        for m in (1, 5, 8, 9, 70, 300):
            x = torch.randn(m, k, generator=g)
            want = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
            torch.testing.assert_close(ops.packed_linear(x, packed, n, bias).double(), want, rtol=1e-5, atol=1e-4)
            got = ops.packed_linear(x, packed, n, None)
            torch.testing.assert_close(got.double(), want - bias.double(), rtol=1e-5, atol=1e-4)
            # Each token's outputs are the same bits whatever it is batched with.
            for row in {0, m // 2, m - 1}:
                assert torch.equal(ops.packed_linear(x[row:row + 1].clone(), packed, n, None)[0], got[row])
