"""A running sum kept in an implicit state: OUTPUT = OUTPUT_STATE = INPUT_STATE + INPUT.

The server hands each request its sequence's INPUT_STATE (zeros at START, from `initial_state`) and
keeps the OUTPUT_STATE it returns for the sequence's next request; the model itself holds nothing.
"""
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            total = (state + value).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total),
                                                         pb_utils.Tensor("OUTPUT_STATE", total)]))
        return responses
