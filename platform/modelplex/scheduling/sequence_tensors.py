"""The tensors the sequence batcher adds to a request (controls, implicit states) and the state outputs
it takes back from the response, so a sequence's next request reads what its last one wrote."""
from __future__ import annotations

from ..core.tensors import InferRequest, InferResponse, InferTensor, RequestedOutput
from .sequence_config import SequenceSettings
from .sequence_slots import SequenceRequest


def prepare_request(settings: SequenceSettings, request: InferRequest, pending: SequenceRequest | None,
                    output_names: tuple[str, ...]) -> InferRequest:
    """What the instance receives for `pending`; for None, a padding request shaped like `request`
    (READY false, CORRID 0, initial states: the model must ignore its inputs, as in Triton)."""
    if pending is None:
        controls = settings.control_tensors(False, False, False, 0)
        states, parameters, request_id = None, {}, ""
    else:
        sequence = pending.sequence
        if pending.start:
            sequence.states = None  # START: the sequence begins again from its initial states
        controls = settings.control_tensors(pending.start, pending.end, True, sequence.corrid)
        states, parameters, request_id = sequence.states, request.parameters, request.id
    inputs = [*request.inputs, *controls, *_state_inputs(settings, states)]
    outputs = request.outputs
    if settings.states:  # name the state outputs, so a backend computing only what is asked computes them
        asked = [o.name for o in outputs] or list(output_names)
        outputs = [RequestedOutput(name) for name in dict.fromkeys(
            [*asked, *(s.output_name for s in settings.states)])]
    return InferRequest(request.model_name, inputs, request.model_version, request_id, outputs, parameters)


def _state_inputs(settings: SequenceSettings, states: dict | None) -> list[InferTensor]:
    tensors = []
    for spec in settings.states:
        data = spec.initial if states is None else states.get(spec.input_name, spec.initial)
        if settings.batched:
            data = data[None]
        tensors.append(InferTensor(spec.input_name, spec.datatype, list(data.shape), data))
    return tensors


def take_states(settings: SequenceSettings, pending: SequenceRequest, response: InferResponse) -> InferResponse:
    """Keep the state outputs of `response` as the sequence's states, and leave them out of what the
    client gets (they are not model outputs). A state the model did not write keeps its value."""
    if not settings.states:
        return response
    by_output = {s.output_name: s for s in settings.states}
    sequence = pending.sequence
    states = dict(sequence.states or {})
    kept = []
    for tensor in response.outputs:
        spec = by_output.get(tensor.name)
        if spec is None:
            kept.append(tensor)
            continue
        data = tensor.data
        states[spec.input_name] = data[0] if settings.batched and data.ndim and data.shape[0] == 1 else data
    sequence.states = states
    response.outputs = kept
    return response
