"""Models for the PyTorch backend's tests, written from code: TorchScript files and a torch.export program."""
from __future__ import annotations

from pathlib import Path

import torch

SIMPLE = "simple_pytorch"  # the example builder's TorchScript `simple`
BATCHED = "simple_pytorch_batched"


class Scaled(torch.nn.Module):
    """Forward-argument names in, a dict out: scaled = features * scale, total = row sums of features."""

    def forward(self, features: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"scaled": features * scale, "total": features.sum(dim=1, keepdim=True)}


SCALED_CONFIG = """\
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "features" data_type: TYPE_FP32 dims: [ 3 ] },
        { name: "scale" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "total" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "scaled" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def scaled_example() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([[2.0], [0.5]])


def write_model(repo: Path, name: str, config: str | None, save=None, filename: str = "model.pt") -> Path:
    """`repo/name/config.pbtxt` (when `config` is given) and `save(path)` writing `1/<filename>`."""
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    if save is not None:
        save(folder / "1" / filename)
    return folder


def save_torchscript(module: torch.nn.Module):
    scripted = torch.jit.script(module)
    return lambda path: scripted.save(str(path))


def save_exported(module: torch.nn.Module, example: tuple[torch.Tensor, ...]):
    """torch.export with a dynamic first (batch) dimension on every argument."""
    batch = torch.export.Dim("batch", max=64)
    dynamic = tuple({0: batch} for _ in example)
    program = torch.export.export(module, example, dynamic_shapes=dynamic)
    return lambda path: torch.export.save(program, str(path))


MODES_CONFIG = """\
backend: "pytorch"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "sum__0" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "modes__1" data_type: TYPE_INT64 dims: [ 2 ] } ]
"""


class Modes(torch.nn.Module):
    """(x + 1, [is_inference, is_grad_enabled] per row): the grad mode forward() ran under."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        modes = torch.tensor([int(y.is_inference()), int(torch.is_grad_enabled())])
        return y, modes.expand(x.shape[0], 2)


def parameter(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
