"""minilm_pipeline step 3: the attention-mask-weighted mean of minilm's token states, L2-normalised
(sentence-transformers' recipe for all-MiniLM-L6-v2) -> EMBEDDINGS."""
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            hidden = pb_utils.get_input_tensor_by_name(request, "last_hidden_state").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()[..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            embeddings = pb_utils.Tensor("EMBEDDINGS", (pooled / norms).astype(np.float32))
            responses.append(pb_utils.InferenceResponse([embeddings]))
        return responses
