"""Loads a model file into a `Program`: a TorchScript module (`model.pt`, `torch.jit.load`) or a
`torch.export` program (`model.pt2`, `torch.export.load`), with what each reveals about its tensors.

TorchScript reveals argument names and the result's kind (tensor, tuple of n, dict), not shapes or
dtypes; an exported program reveals all of them, which is what auto-complete reads.
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from modelplex import InvalidInput, TensorSignature, Unsupported

from .dtypes import triton_datatype
from .naming import OutputSelector, input_names

TORCHSCRIPT, EXPORTED = "TorchScript", "torch.export"  # how messages name the two formats
DEFAULT_FILENAME, EXPORTED_FILENAME = "model.pt", "model.pt2"


@dataclass
class Program:
    """A loaded model. `num_results` is None when only a run tells (a TorchScript list or dict);
    `result_keys` lists a dict result's keys ([] while unknown), None when the result is no dict.
    `inputs`/`outputs` (dtype and dims per argument and result, in order) exist for exported programs."""

    module: torch.nn.Module
    model_format: str
    arg_names: list[str]
    num_results: int | None
    result_keys: list[str] | None
    inputs: list[TensorSignature] | None = None
    outputs: list[TensorSignature] | None = None

    def signatures(self, model: str, config_inputs: list[str], selectors: list[OutputSelector]
                   ) -> tuple[list[TensorSignature], list[TensorSignature]]:
        """An exported program's (inputs, outputs) under the names config.pbtxt gives them (by Triton's
        naming rules); tensors the config does not name keep their default names."""
        inputs = [replace(s, name=n) for s, n in zip(self.inputs, input_names(model, config_inputs, self.arg_names))]
        outputs = list(self.outputs)
        for selector in selectors:
            index = selector.index if selector.key is None else self.result_keys.index(selector.key)
            outputs[index] = replace(outputs[index], name=selector.name)
        return inputs, outputs


def resolve_model_file(version_path: Path, filename: str) -> Path:
    """The file to load: `filename` (config's `default_model_filename`), except that a version folder
    holding `model.pt2` and no `model.pt` serves the exported program without a config line for it."""
    path = version_path / filename
    if filename == DEFAULT_FILENAME and not path.exists() and (version_path / EXPORTED_FILENAME).is_file():
        return version_path / EXPORTED_FILENAME
    return path


def load_program(model: str, path: Path, device: torch.device | None) -> Program:
    """`path` loaded onto `device` (None: where the file's tensors were saved, Triton's KIND_MODEL)."""
    if not path.is_file():
        raise InvalidInput(f"model '{model}': {path} is not a file")
    if path.suffix == ".pt2":
        return _load_exported(model, path, device)
    return _load_torchscript(model, path, device)


def _load_torchscript(model: str, path: Path, device: torch.device | None) -> Program:
    try:
        module = torch.jit.load(str(path), map_location=device)
    except Exception as e:  # torch raises RuntimeError/ValueError for anything that is not TorchScript
        raise InvalidInput(f"model '{model}': {path.name} is not a TorchScript file (save one with "
                           f"torch.jit.script(m).save() or torch.jit.trace): {e}") from None
    module.eval()
    schema = module.forward.schema
    args = [a for a in schema.arguments if a.type.kind() != "ClassType"]  # `self`
    for arg in args:
        if arg.type.kind() != "TensorType":
            raise InvalidInput(f"model '{model}': forward() argument '{arg.name}' is {arg.type}; the pytorch "
                               "backend passes Tensor arguments only")
    returns = schema.returns[0].type if schema.returns else None
    kind = returns.kind() if returns is not None else ""
    if kind == "TensorType":
        num_results, keys = 1, None
    elif kind == "TupleType":
        num_results, keys = len(returns.elements()), None
    elif kind == "ListType":
        num_results, keys = None, None
    elif kind == "DictType":
        num_results, keys = None, []
    else:
        raise InvalidInput(f"model '{model}': forward() returns {returns}; the pytorch backend takes a Tensor, "
                           "a tuple or list of Tensors, or a Dict[str, Tensor]")
    return Program(module, TORCHSCRIPT, [a.name for a in args], num_results, keys)


def _load_exported(model: str, path: Path, device: torch.device | None) -> Program:
    if _is_aoti_package(path):
        raise Unsupported(f"model '{model}': {path.name} is an AOT Inductor package (Triton's 'torch_aoti'); the "
                          "pytorch backend serves torch.export programs saved with torch.export.save")
    try:
        program = torch.export.load(str(path))
    except Exception as e:  # a zip that is no exported program, or one from an incompatible torch
        raise InvalidInput(f"model '{model}': {path.name} is not a torch.export program (save one with "
                           f"torch.export.save): {e}") from None
    arg_specs, kwarg_specs = program.call_spec.in_spec.children()
    if kwarg_specs.num_children or not all(c.is_leaf() for c in arg_specs.children()):
        raise InvalidInput(f"model '{model}': the exported forward() takes keyword or nested arguments; the "
                           "pytorch backend passes positional Tensor arguments only")
    inputs = [_signature(model, "argument", node) for node in _user_input_nodes(program)]
    out_spec = program.call_spec.out_spec
    if out_spec.is_leaf():
        keys = None
    elif out_spec.type in (tuple, list, dict) and all(c.is_leaf() for c in out_spec.children()):
        keys = [str(k) for k in out_spec.context] if out_spec.type is dict else None
    else:
        raise InvalidInput(f"model '{model}': the exported forward() returns {out_spec.type.__name__} of nested "
                           "values; the pytorch backend takes a Tensor, a tuple or list of Tensors, or a dict")
    result_nodes = list(program.graph.output_node().args[0])[-out_spec.num_leaves:]
    names = keys if keys is not None else [f"OUTPUT__{i}" for i in range(len(result_nodes))]
    outputs = [_signature(model, "result", node, name) for node, name in zip(result_nodes, names)]
    module = program.module()
    if device is not None:
        module = module.to(device)
    return Program(module, EXPORTED, [s.name for s in inputs], len(outputs), keys, inputs, outputs)


def _user_input_nodes(program) -> list:
    user_inputs = set(program.graph_signature.user_inputs)
    return [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs]


def _signature(model: str, what: str, node, name: str | None = None) -> TensorSignature:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise InvalidInput(f"model '{model}': exported {what} '{node.name}' is {type(value).__name__}, not a "
                           "Tensor; the pytorch backend passes Tensors only")
    # A symbolic (dynamic) dimension is a SymInt; a static one a plain int.
    dims = tuple(d if isinstance(d, int) else -1 for d in value.shape)
    return TensorSignature(name or node.name, triton_datatype(value.dtype), dims, str(value.dtype))


def _is_aoti_package(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/aotinductor/" in name for name in archive.namelist())
    except zipfile.BadZipFile:
        return False  # torch.export.load names the problem
