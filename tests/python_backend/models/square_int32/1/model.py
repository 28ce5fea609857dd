"""Triton's decoupled `square` example: for IN = n, n responses each holding n, then the final flag."""
import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            threading.Thread(target=self.respond, args=(request.get_response_sender(), int(n[0])), daemon=True).start()
        return None

    def respond(self, sender, n):
        for _ in range(n):
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.array([n], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
