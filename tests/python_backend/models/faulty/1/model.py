"""Misbehaves as MODE says: raise, error (a TritonError response), count (two responses for one request),
dtype (FP64 where the config says FP32), shape ([2, 2] where it says [1]), not_tensor (a list among output tensors), none (returns None),
twice (two responses through the response sender); anything else answers OUT = 1, "sender" through the
response sender (Triton lets models that are not decoupled answer that way too)."""
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0].decode()
        good = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.float32))])
        if mode == "raise":
            raise ValueError("the model broke on purpose")
        if mode == "error":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("MODE is not valid",
                                                                          pb_utils.TritonError.INVALID_ARG))]
        if mode == "count":
            return [good, good]
        if mode == "dtype":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.float64))])]
        if mode == "shape":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones((2, 2), np.float32))])]
        if mode == "not_tensor":
            return [pb_utils.InferenceResponse([[1.0]])]
        if mode == "none":
            return None
        if mode in ("sender", "twice"):
            sender = requests[0].get_response_sender()
            if mode == "twice":
                sender.send(good)
            sender.send(good, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return [good]
