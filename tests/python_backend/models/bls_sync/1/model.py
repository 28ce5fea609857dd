"""Forwards INPUT0/INPUT1 to the model named by MODEL_NAME with a blocking BLS call (as Triton's bls/sync_model.py)."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            bls_request = pb_utils.InferenceRequest(
                model_name=model_name.decode(),
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")])
            bls_response = bls_request.exec()
            if bls_response.has_error():
                raise pb_utils.TritonModelException(bls_response.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=bls_response.output_tensors()))
        return responses
