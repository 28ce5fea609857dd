"""Tokenizer (with chat template) from the HF folder or the GGUF metadata, via transformers."""
from __future__ import annotations

import os
import threading

from . import find_gguf

# transformers resolves its names lazily on first import; two engines loading at once (two models,
# or two instances) raced there ("cannot import name 'AutoTokenizer'"), so the first import is serialized.
_IMPORT_LOCK = threading.Lock()


def load_tokenizer(model_path: str):
    with _IMPORT_LOCK:
        from transformers import AutoTokenizer

    gguf_file = find_gguf(model_path)
    if gguf_file:
        return AutoTokenizer.from_pretrained(os.path.dirname(gguf_file), gguf_file=os.path.basename(gguf_file))
    return AutoTokenizer.from_pretrained(model_path)
