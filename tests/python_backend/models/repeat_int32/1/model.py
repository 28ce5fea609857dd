"""Triton's decoupled `repeat` example: one response per element of IN (OUT = IN[i], IDX = i), each after
DELAY[i] ms, sent from a thread; execute returns after WAIT ms; then the final flag."""
import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException(f"model {args['model_name']} must be decoupled")
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(self.model_config, "OUT")["data_type"])
        self.idx_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(self.model_config, "IDX")["data_type"])
        self.threads = []

    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"unsupported batch size {len(requests)}")
        request = requests[0]
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        if values.shape != delays.shape:
            raise pb_utils.TritonModelException(f"IN and DELAY shapes differ: {values.shape} vs {delays.shape}")
        thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), values, delays),
                                  daemon=True)
        thread.start()
        self.threads.append(thread)
        time.sleep(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0] / 1000)
        return None

    def respond(self, sender, values, delays):
        for idx, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(delay / 1000)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("IDX", np.array([idx], self.idx_dtype)),
                pb_utils.Tensor("OUT", np.array([value], self.out_dtype))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
