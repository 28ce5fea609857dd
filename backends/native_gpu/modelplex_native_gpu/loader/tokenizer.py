"""Tokenizer (with chat template) from the HF folder or the GGUF metadata, via transformers."""
from __future__ import annotations

import os
import threading

from . import find_gguf

# transformers resolves its modules lazily, also inside from_pretrained (its GGUF integration): two
# engines loading at once (two models, or two instances) raced there ("cannot import name
# 'AutoTokenizer'", "... 'GGUF_CONFIG_ARCHS'"), so tokenizer loads are serialized (a few seconds each).
_LOAD_LOCK = threading.Lock()


def load_tokenizer(model_path: str):
    with _LOAD_LOCK:
        from transformers import AutoTokenizer

        gguf_file = find_gguf(model_path)
        if gguf_file:
            return AutoTokenizer.from_pretrained(os.path.dirname(gguf_file), gguf_file=os.path.basename(gguf_file))
        return AutoTokenizer.from_pretrained(model_path)
