"""The DAG of an `ensemble_scheduling` config, checked at load against the step models' configs.

Tensor names here are the ensemble's: `input_map` maps a step model's input to the ensemble tensor
it reads, `output_map` a step model's output to the ensemble tensor it writes. Steps are numbered
from 1 in config order, as error messages name them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from modelplex import InvalidInput, ModelplexError, tensor_specs


@dataclass(frozen=True)
class TensorType:
    datatype: str
    shape: tuple[int, ...]  # with the batch dimension (-1) when the model batches

    def accepts(self, other: TensorType) -> bool:
        return (self.datatype == other.datatype and len(self.shape) == len(other.shape)
                and all(a == b or a == -1 or b == -1 for a, b in zip(self.shape, other.shape)))

    def __str__(self) -> str:
        return f"{self.datatype}{list(self.shape)}"


@dataclass(frozen=True)
class EnsembleStep:
    number: int
    model_name: str
    model_version: str  # "" for the latest ready version (config's -1)
    input_map: dict[str, str]  # step model input -> ensemble tensor
    output_map: dict[str, str]  # step model output -> ensemble tensor
    is_decoupled: bool

    @property
    def label(self) -> str:
        return f"step {self.number} (model '{self.model_name}')"


@dataclass(frozen=True)
class Ensemble:
    """Invariant (checked by `build`): every tensor a step reads is an ensemble input or written by
    exactly one earlier-runnable step, the steps form no cycle, and at most the last step streams."""

    name: str
    steps: tuple[EnsembleStep, ...]
    input_names: frozenset[str]
    output_names: tuple[str, ...]

    @property
    def streaming_step(self) -> EnsembleStep | None:
        return next((s for s in self.steps if s.is_decoupled), None)


def _types(config) -> tuple[dict[str, TensorType], dict[str, TensorType]]:
    batch = (-1,) if config.max_batch_size > 0 else ()
    inputs = {n: TensorType(s.datatype, batch + s.dims) for n, s in tensor_specs(config.input).items()}
    outputs = {n: TensorType(s.datatype, batch + s.dims) for n, s in tensor_specs(config.output).items()}
    return inputs, outputs


def build(config, config_of: Callable[[str, str], object]) -> Ensemble:
    """Check `config.ensemble_scheduling` and return its DAG; `config_of(model, version)` gives a
    loaded step model's config. Raises `InvalidInput` naming the step at fault."""
    name = config.name
    if not config.ensemble_scheduling.step:
        raise InvalidInput(f"ensemble '{name}' has no ensemble_scheduling steps")
    ensemble_inputs, ensemble_outputs = _types(config)
    produced: dict[str, tuple[TensorType, str]] = {t: (ty, "an ensemble input") for t, ty in ensemble_inputs.items()}
    steps, reads = [], []
    for number, step in enumerate(config.ensemble_scheduling.step, 1):
        label = f"ensemble '{name}' step {number} (model '{step.model_name}')"
        version = str(step.model_version) if step.model_version >= 0 else ""
        try:
            step_config = config_of(step.model_name, version)
        except ModelplexError as e:
            raise InvalidInput(f"{label}: {e.message}") from None
        # A batching step must take every batch the ensemble may be sent (Triton's rule and words).
        if 0 < step_config.max_batch_size < config.max_batch_size:
            raise InvalidInput(f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                               f"contains model {step.model_name} which only allows maximum batch size to be "
                               f"{step_config.max_batch_size}")
        model_inputs, model_outputs = _types(step_config)
        # protobuf maps have no order: sort, so the same config always reports the same problem first
        input_map, output_map = dict(sorted(step.input_map.items())), dict(sorted(step.output_map.items()))
        for model_input, tensor in input_map.items():
            if model_input not in model_inputs:
                raise InvalidInput(f"{label}: input_map names '{model_input}', which is not an input of the model")
            reads.append((label, number, tensor, model_inputs[model_input], f"its input '{model_input}'"))
        missing = [n for n, s in tensor_specs(step_config.input).items() if not s.optional and n not in input_map]
        if missing:
            raise InvalidInput(f"{label}: input_map gives no tensor for the model's input(s) {', '.join(missing)}")
        for model_output, tensor in output_map.items():
            if model_output not in model_outputs:
                raise InvalidInput(f"{label}: output_map names '{model_output}', which is not an output of the model")
            if tensor in produced:
                raise InvalidInput(f"{label}: tensor '{tensor}' is also written by {produced[tensor][1]}")
            produced[tensor] = (model_outputs[model_output], f"step {number}")
        decoupled = step_config.model_transaction_policy.decoupled
        steps.append(EnsembleStep(number, step.model_name, version, input_map, output_map, decoupled))
    for output, ty in ensemble_outputs.items():
        reads.append((f"ensemble '{name}'", 0, output, ty, "its output"))
    _check_reads(reads, produced)
    _check_acyclic(name, steps)
    _check_streaming(name, steps, config)
    return Ensemble(name, tuple(steps), frozenset(ensemble_inputs), tuple(ensemble_outputs))


def _check_reads(reads, produced) -> None:
    for label, _, tensor, wanted, what in reads:
        if tensor not in produced:
            raise InvalidInput(f"{label}: tensor '{tensor}' for {what} is never produced "
                               "(not an ensemble input nor any step's output)")
        have, source = produced[tensor]
        if not wanted.accepts(have):
            raise InvalidInput(f"{label}: tensor '{tensor}' for {what} must be {wanted}, "
                               f"but {source} makes it {have}")


def _check_acyclic(name: str, steps: list[EnsembleStep]) -> None:
    """Kahn's algorithm over the steps; what never becomes runnable lies on (or after) a cycle."""
    writer = {tensor: s.number for s in steps for tensor in s.output_map.values()}
    needs = {s.number: {writer[t] for t in s.input_map.values() if t in writer} for s in steps}
    done: set[int] = set()
    while True:
        runnable = [n for n, deps in needs.items() if n not in done and deps <= done]
        if not runnable:
            break
        done.update(runnable)
    stuck = [s for s in steps if s.number not in done]
    if stuck:
        raise InvalidInput(f"ensemble '{name}': {stuck[0].label} is on a cycle: steps "
                           f"{', '.join(str(s.number) for s in stuck)} wait on each other's outputs")


def _check_streaming(name: str, steps: list[EnsembleStep], config) -> None:
    """A decoupled step streams the ensemble's answer, so it must be the one step nothing reads from."""
    streaming = [s for s in steps if s.is_decoupled]
    if not streaming:
        return
    if len(streaming) > 1:
        raise InvalidInput(f"ensemble '{name}': {streaming[1].label} is decoupled, but only one step "
                           "(the last) may stream")
    step = streaming[0]
    read = {t for s in steps for t in s.input_map.values()}
    if read & set(step.output_map.values()):
        raise InvalidInput(f"ensemble '{name}': {step.label} is decoupled, so it must be the last step "
                           "(no other step may read its outputs)")
    if not config.model_transaction_policy.decoupled:
        raise InvalidInput(f"ensemble '{name}': {step.label} is decoupled, so the ensemble streams too: "
                           "set model_transaction_policy { decoupled: true }")
