"""Checks an inference request against the model's config before any backend sees it."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import InvalidInput
from ..core.tensors import CONFIG_TO_TRITON, InferRequest, InferTensor


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    optional: bool


def tensor_specs(tensors) -> dict[str, TensorSpec]:
    from tritonclient.grpc import model_config_pb2 as pb

    specs = {}
    for t in tensors:
        datatype = CONFIG_TO_TRITON.get(pb.DataType.Name(t.data_type), "")
        reshape = tuple(t.reshape.shape) if t.HasField("reshape") else None
        specs[t.name] = TensorSpec(t.name, datatype, tuple(t.dims), reshape, getattr(t, "optional", False))
    return specs


class RequestValidator:
    """Precomputed view of a config's inputs/outputs; `check` runs on every request."""

    def __init__(self, config):
        self.model = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = tensor_specs(config.input)
        self.outputs = tensor_specs(config.output)

    def check(self, request: InferRequest) -> int:
        """Raise `InvalidInput` naming the problem; returns the request's batch size (1 if unbatched)."""
        batch = 0
        seen = set()
        for tensor in request.inputs:
            spec = self.inputs.get(tensor.name)
            if spec is None:
                raise InvalidInput(f"unexpected inference input '{tensor.name}' for model '{self.model}'")
            if tensor.name in seen:
                raise InvalidInput(f"input '{tensor.name}' already exists in request")
            seen.add(tensor.name)
            if tensor.datatype != spec.datatype:
                raise InvalidInput(f"input '{tensor.name}' has datatype {tensor.datatype}, "
                                   f"model '{self.model}' expects {spec.datatype}")
            batch = self._check_shape(tensor, spec, batch)
        for name, spec in self.inputs.items():
            if name not in seen and not spec.optional:
                raise InvalidInput(f"expected input '{name}' for model '{self.model}' is missing")
        outputs = set()
        for out in request.outputs:
            if out.name not in self.outputs:
                raise InvalidInput(f"unexpected inference output '{out.name}' for model '{self.model}'")
            if out.name in outputs:
                raise InvalidInput(f"output '{out.name}' already exists in request")  # Triton's words
            outputs.add(out.name)
        return batch or 1

    def _check_shape(self, tensor: InferTensor, spec: TensorSpec, batch: int) -> int:
        shape = tuple(tensor.shape)
        dims = shape
        if self.max_batch_size > 0:
            if not shape:
                raise InvalidInput(f"input '{tensor.name}' has no batch dimension")
            if not 1 <= shape[0] <= self.max_batch_size:
                raise InvalidInput(f"input '{tensor.name}' batch size {shape[0]} exceeds the model's "
                                   f"max_batch_size {self.max_batch_size}" if shape[0] > 0 else
                                   f"input '{tensor.name}' has batch size {shape[0]}")
            if batch and shape[0] != batch:
                raise InvalidInput(f"input '{tensor.name}' batch size {shape[0]} differs from other inputs' {batch}")
            batch, dims = shape[0], shape[1:]
        if len(dims) != len(spec.dims) or any(d != e and e != -1 for d, e in zip(dims, spec.dims)):
            expected = ([-1] if self.max_batch_size > 0 else []) + list(spec.dims)
            raise InvalidInput(f"unexpected shape for input '{tensor.name}' for model '{self.model}'. "
                               f"Expected {expected}, got {list(shape)}")
        if spec.reshape is not None:
            new = ((shape[0],) if self.max_batch_size > 0 else ()) + spec.reshape
            tensor.data = tensor.data.reshape(new)
            tensor.shape = list(new)
        return batch
