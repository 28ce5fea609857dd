"""initialize raises: the model must fail to load with this message, and nothing else with it."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("no weights for this model")

    def execute(self, requests):
        raise AssertionError("never loaded")
