"""Answers with its worker's pid and the `initialize` args it was given (as JSON); sleeps X ms first."""
import json
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = json.dumps(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0] / 1000)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
                pb_utils.Tensor("ARGS", np.array([self.args.encode()], np.object_))]))
        return responses
