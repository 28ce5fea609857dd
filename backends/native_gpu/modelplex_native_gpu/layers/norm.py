"""RMSNorm computed in fp32 like HF's LlamaRMSNorm, so fp32 mode matches it bit for bit."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps
        # mean() on CPU is sum() then div_(n); dividing by a 0-dim fp32 tensor skips wrapping the Python
        # number on every call (same bits, a quarter less time at decode sizes). A plain attribute, not a
        # buffer: model.to(dtype) must not round it, and a 0-dim CPU tensor works with CUDA tensors too.
        self.size = torch.tensor(float(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype != torch.float32:
            x = x.float()
        x = x * x.pow(2).sum(-1, keepdim=True).div_(self.size).add_(self.eps).rsqrt_()  # HF's ops, fewer temporaries
        return self.weight * (x if dtype == torch.float32 else x.to(dtype))

    def norm(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """`forward`, through the fused CPU op when `ops` (torch.ops.modelplex_cpu) is given."""
        return self.forward(x) if ops is None else ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor, ops=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); with `ops`, in one fused call that overwrites both."""
        if ops is None:
            residual = residual + x
            return self.forward(residual), residual
        ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual
