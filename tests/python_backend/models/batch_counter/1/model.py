"""N = how many requests the execute call that answered this one held; X < 0 gets an error response."""
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "X must not be negative", pb_utils.TritonError.INVALID_ARG)))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("N", np.full_like(x, len(requests)))]))
        return responses
