"""Loads, checks and unloads the model named by NAME from inside a model (Triton's pb_utils model control);
STEPS tells what it saw at each step (an error's text for a step that failed)."""
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            steps = [f"ready before: {pb_utils.is_model_ready(name)}"]
            try:
                pb_utils.load_model(name)
                steps.append(f"ready after load: {pb_utils.is_model_ready(name)}")
                pb_utils.unload_model(name)
                steps.append(f"ready after unload: {pb_utils.is_model_ready(name)}")
            except pb_utils.TritonModelException as e:
                steps.append(f"error: {e}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("STEPS", np.array(steps, np.object_))]))
        return responses
