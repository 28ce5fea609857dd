"""`sequence_batching` read at load: Triton's defaults, control tensors, states, and clear errors."""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from modelplex import InvalidInput, TensorSignature, check_config
from modelplex.scheduling.sequence_config import sequence_settings

CONTROLS = """control_input [
  { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
  { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
  { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]"""


def _config(sequence_batching: str, max_batch_size: int = 4) -> pb.ModelConfig:
    return text_format.Parse(f'name: "m" max_batch_size: {max_batch_size} sequence_batching {{ {sequence_batching} }}',
                             pb.ModelConfig())


def test_defaults_and_control_tensors():
    settings = sequence_settings(_config(CONTROLS))
    assert (settings.is_oldest, settings.num_slots, settings.idle_ns) == (False, 4, 1_000_000_000)  # Triton's 1 s
    assert settings.input_names == {"S", "R", "C"}
    start, ready, corrid = settings.control_tensors(True, False, True, "abc")
    assert (start.datatype, start.shape, start.data.tolist()) == ("FP32", [1, 1], [[1.0]])
    assert (ready.datatype, ready.data.tolist()) == ("BOOL", [[True]])
    assert (corrid.datatype, corrid.data.tolist()) == ("BYTES", [[b"abc"]])
    padding = settings.control_tensors(True, True, False, 0)  # READY false: START false too
    assert [t.data.tolist() for t in padding[:2]] == [[[0.0]], [[False]]]


def test_oldest_slots_and_unbatched_shapes():
    settings = sequence_settings(_config("oldest { max_candidate_sequences: 16 preferred_batch_size: [ 2 ] }"))
    assert (settings.is_oldest, settings.num_slots, settings.preferred_sizes) == (True, 16, (2,))
    unbatched = sequence_settings(_config(CONTROLS, max_batch_size=0))
    assert unbatched.num_slots == 1 and unbatched.control_tensors(True, False, True, "x")[0].shape == [1]


def test_initial_state_from_a_data_file(tmp_path):
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "seed").write_bytes(np.array([7, 8], np.int32).tobytes())
    config = _config('state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ 2 ] initial_state: '
                     '{ name: "seed" data_type: TYPE_INT32 dims: [ 2 ] data_file: "seed" } } ]')
    (state,) = sequence_settings(config, tmp_path).states
    assert state.initial.tolist() == [7, 8]


@pytest.mark.parametrize("fields,message", [
    ('control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, '
     '{ name: "B" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]',
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
    ('control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY } ] } ]',
     "must specify exactly one of int32_false_true, fp32_false_true or bool_false_true for CONTROL_SEQUENCE_READY"),
    ('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]',
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for m"),
    ("oldest { preferred_batch_size: [ 8 ] }", "preferred batch size must be positive and <= max batch size"),
    ('state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ 2 ] initial_state: '
     '{ name: "z" data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } ]',
     "The data type used for 'initial_state' field of state 'I' does not match the state data type."),
    ('state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ -1 ] } ]',
     "has variable dims [-1]: it needs an initial_state"),
])
def test_bad_sequence_batching_is_refused_at_load(fields, message):
    with pytest.raises(InvalidInput) as error:
        sequence_settings(_config(fields))
    assert message in error.value.message


def test_control_inputs_of_the_model_file_need_no_input_entry():
    """Triton's simple_sequence config declares START/READY only in sequence_batching; the model file has them."""
    config = _config(CONTROLS)
    config.input.add(name="INPUT", data_type=pb.TYPE_INT32, dims=[1])
    model = [TensorSignature(n, "INT32", (-1, 1), "int32") for n in ("INPUT", "S", "R")]
    check_config(config, model, [], "ONNX")
    model.append(TensorSignature("OTHER", "INT32", (-1, 1), "int32"))
    with pytest.raises(InvalidInput, match="input\\(s\\) 'OTHER' are missing from config.pbtxt"):
        check_config(config, model, [], "ONNX")
