"""Triton's `dyna_sequence` test backend as a Python model: one accumulator per correlation ID.

START sets the accumulator to INPUT, any other request adds INPUT, END adds the correlation ID
(truncated to int32, as Triton's) and forgets it; OUTPUT is the accumulator. A string CORRID must hold
a decimal number. A padding request (READY 0) gets zeros.
"""
import numpy as np

import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0]


def _corrid(request) -> int:
    value = _scalar(request, "CORRID")
    return int(value.decode() if isinstance(value, bytes) else value)


class TritonPythonModel:
    def initialize(self, args):
        self.accumulators = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if not _scalar(request, "READY"):
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.zeros_like(value))]))
                continue
            corrid = _corrid(request)
            total = int(value.sum()) + (0 if _scalar(request, "START") else self.accumulators.get(corrid, 0))
            if _scalar(request, "END"):
                total += int(np.array(corrid, dtype=np.uint64).astype(np.int32))
                self.accumulators.pop(corrid, None)
            else:
                self.accumulators[corrid] = total
            output = np.full(value.shape, total, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)]))
        return responses
