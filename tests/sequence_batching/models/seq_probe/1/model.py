"""A sequence model that reports what it was given: OUTPUT = running sum per correlation_id(), and
INFO (JSON) = its instance, the batch it ran in, its row, correlation_id(), flags() and the control
tensors. The test configs (conftest.py) give it different strategies and CORRID types."""
import json

import numpy as np

import triton_python_backend_utils as pb_utils

CONTROLS = ("START", "END", "READY", "CORRID")


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.sums = {}

    def execute(self, requests):
        responses = []
        for row, request in enumerate(requests):
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            controls = {}
            for name in CONTROLS:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    array = tensor.as_numpy()
                    item = array.flat[0]
                    controls[name] = {"value": item.decode() if isinstance(item, bytes) else item.item(),
                                      "dtype": str(array.dtype), "shape": list(array.shape)}
            corrid = request.correlation_id()
            if controls["READY"]["value"]:
                start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                self.sums[corrid] = int(value.sum()) + (0 if start else self.sums.get(corrid, 0))
            info = {"instance": self.instance, "batch": len(requests), "row": row, "corrid": corrid,
                    "flags": request.flags(), "controls": controls}
            output = np.full(value.shape, self.sums.get(corrid, 0), dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", output),
                pb_utils.Tensor("INFO", np.array([[json.dumps(info).encode()]], dtype=np.object_))]))
        return responses
