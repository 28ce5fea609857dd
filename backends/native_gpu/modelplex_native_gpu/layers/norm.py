"""RMSNorm computed in fp32 like HF's LlamaRMSNorm, so fp32 mode matches it bit for bit."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * x.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()  # HF's ops, fewer temporaries
        return self.weight * x.to(dtype)
