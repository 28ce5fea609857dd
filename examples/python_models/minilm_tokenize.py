"""minilm_pipeline step 1: TEXT (BYTES, one sentence per batch item) -> input_ids, attention_mask (INT64, padded).

Uses the tokenizer files the minilm example saves in `minilm/1/tokenizer/` (config parameter
`tokenizer_dir`, relative to this model's folder), with the `tokenizers` library alone.
"""
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        folder = Path(args["model_repository"]) / parameters["tokenizer_dir"]["string_value"]
        max_length = int(parameters.get("max_length", {}).get("string_value", 256))
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        pad_token = "[PAD]"
        self.tokenizer.enable_padding(pad_id=self.tokenizer.token_to_id(pad_token), pad_token=pad_token)

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            encodings = self.tokenizer.encode_batch([t.decode("utf-8") for t in texts])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("input_ids", ids),
                                                         pb_utils.Tensor("attention_mask", mask)]))
        return responses
