"""The model-config rules Triton applies to every backend at load (its `ValidateModelConfig`,
`ValidateInstanceGroup` and `ValidateBatchIO`), in Triton's words: instance groups, dynamic batching
(preferred sizes, priorities, `preserve_ordering`), `batch_input` and `batch_output`. Ensemble
rules that need the step models' configs live with the ensemble plugin."""
from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as pb

from ..core.errors import InvalidInput


def check(config: pb.ModelConfig) -> None:
    """Raise `InvalidInput` naming the first rule `config` breaks."""
    _instance_groups(config)
    if config.HasField("dynamic_batching"):
        _dynamic_batching(config)
    _batch_inputs(config)
    _batch_outputs(config)


def _instance_groups(config) -> None:
    for group in config.instance_group:
        kind = pb.ModelInstanceGroup.Kind.Name(group.kind)
        if group.gpus and group.kind in (pb.ModelInstanceGroup.KIND_CPU, pb.ModelInstanceGroup.KIND_MODEL):
            raise InvalidInput(f"instance group {group.name} of model {config.name} has kind {kind} but specifies "
                               "one or more GPUs")


def _dynamic_batching(config) -> None:
    batching, name = config.dynamic_batching, config.name
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise InvalidInput(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise InvalidInput(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise InvalidInput(f"default priority level must be in range [1, {levels}] for {name}")
        if any(not 1 <= level <= levels for level in batching.priority_queue_policy):
            raise InvalidInput(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if batching.preserve_ordering:
        # Responses leave in arrival order: priorities and delayed requests would reorder them.
        if levels > 1:
            raise InvalidInput(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == pb.ModelQueuePolicy.DELAY for p in policies):
            raise InvalidInput("Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true "
                               f"for {name}")


def _batch_inputs(config) -> None:
    inputs = {t.name for t in config.input}
    for batch_input in config.batch_input:
        kind = pb.BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise InvalidInput(f"model '{config.name}': batch input kind '{kind}' expects 1 source input, "
                               f"got {len(batch_input.source_input)}")
        if batch_input.data_type not in (pb.TYPE_INT32, pb.TYPE_FP32):
            raise InvalidInput(f"model '{config.name}': batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in batch_input.source_input:
            if source not in inputs:
                raise InvalidInput(f"model '{config.name}': unknown source input name '{source}'")


def _batch_outputs(config) -> None:
    inputs, outputs = {t.name for t in config.input}, {t.name for t in config.output}
    for batch_output in config.batch_output:
        kind = pb.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise InvalidInput(f"model '{config.name}': batch output kind '{kind}' expects 1 source input, "
                               f"got {len(batch_output.source_input)}")
        for source in batch_output.source_input:
            if source not in inputs:
                raise InvalidInput(f"model '{config.name}': unknown source input name '{source}'")
        seen = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise InvalidInput(f"model '{config.name}': unknown target output name '{target}'")
            if target in seen:
                raise InvalidInput(f"model '{config.name}': target output name '{target}' can only be specified "
                                   "once")
            seen.add(target)
