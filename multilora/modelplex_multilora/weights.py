"""One adapter's matrices in host memory, ready to copy into a device slot."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .peft import AdapterSpec, InvalidAdapterError


@dataclass
class LoRAWeights:
    """Per (layer, module): A [r, in] and B^T [r, out] with the adapter's scaling folded in."""

    spec: AdapterSpec
    matrices: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.matrices.values())


def load_weights(spec: AdapterSpec, dtype: torch.dtype) -> LoRAWeights:
    """Read the checked adapter's tensors. Non-finite values are refused: a NaN in one slot would
    reach every token of the batch through the stacked matmul (0 * NaN is NaN)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(spec.weights_file)
    except (SafetensorError, OSError) as e:
        raise InvalidAdapterError(f"{spec.weights_file.name}: {e}") from None
    matrices = {}
    for (layer, module), (a_key, b_key) in spec.tensors.items():
        a, b = tensors[a_key].float(), tensors[b_key].float()
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise InvalidAdapterError(f"layer {layer} {module}: the weights hold NaN or infinite values")
        matrices[(layer, module)] = (a.to(dtype).contiguous(), (b.T * spec.scaling).to(dtype).contiguous())
    return LoRAWeights(spec, matrices)
