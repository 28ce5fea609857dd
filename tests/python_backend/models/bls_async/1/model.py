"""`async def execute` with two concurrent BLS calls to the ONNX `simple` model (as Triton's bls/async_model.py):
OUTPUT0 = simple(a, b).OUTPUT0 = a + b and OUTPUT1 = simple(b, a).OUTPUT1 = b - a."""
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            # simple batches: give it a batch of one
            a = pb_utils.Tensor("INPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[None])
            b = pb_utils.Tensor("INPUT1", pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()[None])
            swapped = [pb_utils.Tensor("INPUT0", b.as_numpy()), pb_utils.Tensor("INPUT1", a.as_numpy())]
            calls = [pb_utils.InferenceRequest(model_name="simple", requested_output_names=["OUTPUT0", "OUTPUT1"],
                                               inputs=inputs).async_exec() for inputs in ([a, b], swapped)]
            straight, reverse = await asyncio.gather(*calls)
            for response in (straight, reverse):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            total = pb_utils.get_output_tensor_by_name(straight, "OUTPUT0").as_numpy()[0]
            difference = pb_utils.get_output_tensor_by_name(reverse, "OUTPUT1").as_numpy()[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total),
                                                         pb_utils.Tensor("OUTPUT1", difference)]))
        return responses
