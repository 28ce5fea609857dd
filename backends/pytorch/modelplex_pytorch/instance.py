"""One model instance: a TorchScript module or exported program on one device, and the thread that
keeps its runs off the event loop."""
from __future__ import annotations

import asyncio
import contextlib
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from modelplex import (
    InferRequest,
    InferResponse,
    InferTensor,
    InstanceContext,
    InternalError,
    InvalidInput,
    ModelInstance,
    ModelplexError,
    Unsupported,
    answer_each,
    check_config,
    tensor_specs,
)

from .dtypes import triton_datatype
from .naming import OutputSelector, input_positions, output_selectors
from .options import apply_thread_counts, execution_options, instance_device
from .program import EXPORTED, load_program, resolve_model_file

# Request tensors arrive as read-only views of the request body; torch only warns that writing to
# them would be undefined (a model has no business writing to its inputs), so the warning is noise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


@dataclass(frozen=True, slots=True)
class _OutputSpec:
    selector: OutputSelector
    datatype: str
    dims: tuple[int, ...] | None  # what clients see when config.pbtxt reshapes the output, else None


class PyTorchInstance(ModelInstance):
    """Invariant: runs never overlap (the host never calls one instance concurrently), and every run
    happens on `_executor`'s one thread: torch releases the GIL inside its ops, so the event loop
    keeps serving while a model computes."""

    def __init__(self, ictx: InstanceContext):
        ctx = ictx.model
        config = ctx.config
        self.model_name = ctx.name
        _refuse_bytes(config)
        self.options = execution_options(ctx.parameters)
        apply_thread_counts(ctx.name, self.options)
        self.device = instance_device(ictx)
        path = resolve_model_file(ctx.version_path, config.default_model_filename)
        self.program = load_program(ctx.name, path, self.device)
        names = [t.name for t in config.input]
        self._positions = input_positions(ctx.name, names, self.program.arg_names)
        selectors = output_selectors(ctx.name, [t.name for t in config.output], self.program.num_results,
                                     self.program.result_keys)
        if self.program.inputs is not None:  # an exported program says what it takes: check the config
            check_config(config, *self.program.signatures(ctx.name, names, selectors), EXPORTED)
        self.max_batch_size = config.max_batch_size
        specs = tensor_specs(config.output)
        self._outputs = {s.name: _output_spec(s, specs[s.name]) for s in selectors}
        self._output_names = list(self._outputs)  # the default when a request names no outputs
        self._input_device = self.device or torch.device("cpu")  # KIND_MODEL: the model moves its inputs
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"pytorch-{ictx.name}")

    async def execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._execute, requests)

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, True)
        self.program = None
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- on the instance's thread ----------------------------------------------------------
    def _execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        """One forward() per request (the host merges a dynamic batch into one request beforehand); a
        request's own error is its entry, so the others still get their answers."""
        return answer_each(requests, self._execute_one)

    def _execute_one(self, request: InferRequest) -> InferResponse:
        args: list[torch.Tensor | None] = [None] * len(self._positions)
        for tensor in request.inputs:
            args[self._positions[tensor.name]] = self._to_torch(tensor)
        missing = [n for n, i in self._positions.items() if args[i] is None]
        if missing:
            raise InvalidInput(f"model '{self.model_name}': the request lacks input(s) {', '.join(missing)}, which "
                               "forward() needs")
        result = self._forward(args)
        names = [o.name for o in request.outputs] if request.outputs else self._output_names
        return InferResponse(self.model_name, "", [self._output(n, result) for n in names])

    def _forward(self, args: list[torch.Tensor]):
        grad_mode = torch.inference_mode() if self.options.inference_mode else torch.no_grad()
        optimized = (torch.jit.optimized_execution(self.options.optimized_execution)
                     if self.program.model_format != EXPORTED else contextlib.nullcontext())
        try:
            with grad_mode, optimized:
                return self.program.module(*args)
        except Exception as e:  # torch raises RuntimeError (and others) for a shape or type it cannot take
            raise InternalError(f"model '{self.model_name}': PyTorch execute failure: {e}") from None

    def _to_torch(self, tensor: InferTensor) -> torch.Tensor:
        data = torch.from_numpy(np.ascontiguousarray(tensor.data))
        return data.to(self._input_device) if self._input_device.type != "cpu" else data

    def _output(self, name: str, result) -> InferTensor:
        spec = self._outputs[name]
        value = spec.selector.pick(self.model_name, result)
        if not isinstance(value, torch.Tensor):
            raise InternalError(f"model '{self.model_name}': output '{name}' is {type(value).__name__}, not a Tensor")
        datatype = triton_datatype(value.dtype)
        if datatype != spec.datatype:
            raise InternalError(f"model '{self.model_name}': output '{name}' is {value.dtype} but config.pbtxt "
                                f"says {spec.datatype}")
        array = value.detach().cpu().numpy()
        if spec.dims is not None:
            array = array.reshape(array.shape[:1 if self.max_batch_size > 0 else 0] + spec.dims)
        return InferTensor(name, datatype, list(array.shape), array)


def _output_spec(selector: OutputSelector, spec) -> _OutputSpec:
    return _OutputSpec(selector, spec.datatype, spec.dims if spec.reshape is not None else None)


def _refuse_bytes(config) -> None:
    """torch has no string tensors: a BYTES (TYPE_STRING) tensor fails the load, named."""
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for name, spec in tensor_specs(tensors).items():
            if spec.datatype == "BYTES":
                raise Unsupported(f"model '{config.name}': {kind} '{name}' is TYPE_STRING (BYTES); the pytorch "
                                  "backend serves numeric and BOOL tensors only")
