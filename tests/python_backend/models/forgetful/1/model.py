"""A decoupled model that sends one response and never the final flag (IN = 0), or returns a list from
execute, which decoupled models must not (IN = 1)."""
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))])
        if pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0] == 1:
            return [response]
        requests[0].get_response_sender().send(response)
        return None
