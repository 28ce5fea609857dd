"""A model's `sequence_batching` as the sequence batcher uses it: strategy, slots, the control tensors
it adds to each request, and the implicit states it carries from one request of a sequence to the next.

Checked once, at load; every error is an `InvalidInput` naming the model and the field, in Triton's
words where Triton has them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import InvalidInput
from ..core.tensors import CONFIG_TO_TRITON, InferTensor, numpy_dtype

# Triton's defaults: 1 s of idleness ends a sequence; a string correlation ID holds at most 128 bytes.
DEFAULT_IDLE_MICROSECONDS = 1_000_000
MAX_STRING_ID_BYTES = 128
START, END, READY, CORRID = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY",
                             "CONTROL_SEQUENCE_CORRID")
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
INITIAL_STATE_FOLDER = "initial_state"  # Triton reads `data_file` from <model>/initial_state/


@dataclass(frozen=True, slots=True)
class BoolControl:
    """START, END or READY: one tensor `name` holding `false` or `true` of its datatype."""

    kind: str
    name: str
    datatype: str
    false: object
    true: object


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state: the model reads it as input `input_name` and writes it as output `output_name`;
    `initial` (batch dimension excluded) is what a sequence starts from."""

    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray


@dataclass(frozen=True)
class SequenceSettings:
    """Everything the batcher reads from `sequence_batching`."""

    model: str
    is_oldest: bool
    batched: bool  # max_batch_size > 0: control and state tensors carry a batch dimension
    max_batch_size: int  # at least 1
    num_slots: int  # sequence slots per instance
    preferred_sizes: tuple[int, ...]
    delay_ns: int
    idle_ns: int
    controls: tuple[BoolControl, ...]
    corrid_name: str | None
    corrid_type: str | None
    states: tuple[StateSpec, ...]

    @property
    def input_names(self) -> set[str]:
        """The inputs the batcher supplies (clients never send them; the model receives them)."""
        return {c.name for c in self.controls} | {self.corrid_name} - {None} | {s.input_name for s in self.states}

    def control_tensors(self, start: bool, end: bool, ready: bool, corrid) -> list[InferTensor]:
        """Triton's control values for one request: READY false marks a padding request."""
        flags = {START: start and ready, END: end and ready, READY: ready}
        shape = [1, 1] if self.batched else [1]
        tensors = [InferTensor(c.name, c.datatype, shape,
                               np.full(shape, c.true if flags[c.kind] else c.false, numpy_dtype(c.datatype)))
                   for c in self.controls]
        if self.corrid_name is not None:
            datatype = CONFIG_TO_TRITON[self.corrid_type]
            value = (corrid if isinstance(corrid, str) else "").encode() if datatype == "BYTES" else corrid or 0
            data = np.full(shape, value, numpy_dtype(datatype)) if datatype != "BYTES" else \
                np.array([value], dtype=np.object_).reshape(shape)
            tensors.append(InferTensor(self.corrid_name, datatype, shape, data))
        return tensors


def sequence_settings(config, model_path: Path | None = None) -> SequenceSettings:
    """Read and check `config.sequence_batching` (model_path: where `initial_state` data files live)."""
    sb = config.sequence_batching
    name = config.name
    max_batch_size = max(1, config.max_batch_size)
    is_oldest = sb.HasField("oldest")
    strategy = sb.oldest if is_oldest else sb.direct
    preferred = tuple(sorted(set(sb.oldest.preferred_batch_size))) if is_oldest else ()
    for size in preferred:
        if not 0 < size <= max_batch_size:
            raise InvalidInput(f"sequence batching preferred batch size must be positive and <= max batch size "
                               f"for {name}, got {size}")
    # Triton: direct gives each instance one slot per batch row; oldest max_candidate_sequences slots.
    num_slots = (sb.oldest.max_candidate_sequences or max_batch_size) if is_oldest else max_batch_size
    controls, corrid = _controls(sb, name)
    return SequenceSettings(
        model=name, is_oldest=is_oldest, batched=config.max_batch_size > 0, max_batch_size=max_batch_size,
        num_slots=num_slots, preferred_sizes=preferred, delay_ns=strategy.max_queue_delay_microseconds * 1000,
        idle_ns=(sb.max_sequence_idle_microseconds or DEFAULT_IDLE_MICROSECONDS) * 1000,
        controls=tuple(controls), corrid_name=corrid[0], corrid_type=corrid[1],
        states=tuple(_state(s, name, model_path) for s in sb.state))


def _controls(sb, model: str) -> tuple[list[BoolControl], tuple[str | None, str | None]]:
    from tritonclient.grpc import model_config_pb2 as pb

    controls: list[BoolControl] = []
    corrid: tuple[str | None, str | None] = (None, None)
    seen: set[str] = set()
    for control_input in sb.control_input:
        if not control_input.name:
            raise InvalidInput(f"sequence batching control_input for {model} must have a name")
        for control in control_input.control:
            kind = pb.ModelSequenceBatching.Control.Kind.Name(control.kind)
            if kind in seen:
                raise InvalidInput(f"sequence batching specifies multiple {kind} tensors for {model}")
            seen.add(kind)
            if kind == CORRID:
                datatype = pb.DataType.Name(control.data_type)
                if datatype not in CORRID_TYPES:
                    raise InvalidInput(f"unexpected data type for control {CORRID} for {model}. Allowed data types "
                                       f"are {', '.join(CORRID_TYPES[:-1])} and {CORRID_TYPES[-1]}")
                corrid = (control_input.name, datatype)
                continue
            controls.append(_bool_control(kind, control_input.name, control, model))
    return controls, corrid


def _bool_control(kind: str, name: str, control, model: str) -> BoolControl:
    given = [(field, list(values)) for field, values in (("int32_false_true", control.int32_false_true),
                                                         ("fp32_false_true", control.fp32_false_true),
                                                         ("bool_false_true", control.bool_false_true)) if values]
    if len(given) != 1:
        raise InvalidInput(f"sequence batching must specify exactly one of int32_false_true, fp32_false_true or "
                           f"bool_false_true for {kind} of {model}")
    field, values = given[0]
    if len(values) != 2:
        raise InvalidInput(f"sequence batching control {kind} of {model} must have two {field} values "
                           f"(false, true), got {len(values)}")
    datatype = {"int32_false_true": "INT32", "fp32_false_true": "FP32", "bool_false_true": "BOOL"}[field]
    return BoolControl(kind, name, datatype, values[0], values[1])


def _state(state, model: str, model_path: Path | None) -> StateSpec:
    from tritonclient.grpc import model_config_pb2 as pb

    where = f"state input '{state.input_name}' of {model}"
    if not state.input_name or not state.output_name:
        raise InvalidInput(f"sequence batching state of {model} must have input_name and output_name")
    datatype = CONFIG_TO_TRITON.get(pb.DataType.Name(state.data_type))
    dims = list(state.dims)
    if datatype is None or not dims:
        raise InvalidInput(f"{where} must have a data_type and dims")
    if len(state.initial_state) > 1:
        raise InvalidInput(f"initial_state field for state input '{state.input_name}' must contain exactly one or "
                           f"zero element. Found '{len(state.initial_state)}' elements.")
    if not state.initial_state:
        if any(d < 0 for d in dims):
            raise InvalidInput(f"{where} has variable dims {dims}: it needs an initial_state with fixed dims")
        return StateSpec(state.input_name, state.output_name, datatype, _zeros(datatype, dims))
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise InvalidInput(f"The data type used for 'initial_state' field of state '{state.input_name}' does not "
                           "match the state data type.")
    shape = list(initial.dims)
    if len(shape) != len(dims) or any(d < 0 or (s >= 0 and d != s) for d, s in zip(shape, dims)):
        raise InvalidInput(f"'initial_state' dims {shape} of {where} do not match the state dims {dims}")
    if initial.WhichOneof("state_data") == "data_file":
        return StateSpec(state.input_name, state.output_name, datatype,
                         _read_initial(model_path, initial.data_file, datatype, shape, where))
    return StateSpec(state.input_name, state.output_name, datatype, _zeros(datatype, shape))


def _zeros(datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    return np.zeros(shape, numpy_dtype(datatype))


def _read_initial(model_path: Path | None, data_file: str, datatype: str, shape: list[int], where: str) -> np.ndarray:
    """Raw little-endian elements (Triton's format) from <model>/initial_state/<data_file>."""
    folder = (model_path or Path(".")) / INITIAL_STATE_FOLDER
    path = (folder / data_file).resolve()
    if folder.resolve() not in path.parents or not path.is_file():
        raise InvalidInput(f"initial_state data_file '{data_file}' of {where} is not a file in {folder}")
    if datatype == "BYTES":
        raise InvalidInput(f"initial_state data_file of {where}: TYPE_STRING states are not supported")
    dtype = np.dtype(numpy_dtype(datatype))
    raw = path.read_bytes()
    count = int(np.prod(shape))
    if len(raw) < count * dtype.itemsize:
        raise InvalidInput(f"initial_state setting expects {count * dtype.itemsize} bytes, but the data provided "
                           f"from {data_file} only has {len(raw)} bytes.")
    return np.frombuffer(raw[:count * dtype.itemsize], dtype).reshape(shape).copy()
