"""BLS into a decoupled model (as Triton's bls_decoupled/sync_model.py): SUM adds up every OUT square_int32 streams."""
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            bls_request = pb_utils.InferenceRequest(model_name="square_int32", requested_output_names=["OUT"],
                                                    inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            total = np.zeros(1, np.int32)
            for response in bls_request.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
