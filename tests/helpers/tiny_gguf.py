"""Tiny random Llama GGUF files with quantized weights, written with loader/gguf_write.py: the quantized
loading and engine tests' models (2 layers, hidden 256: K-quant rows are whole 256-weight super-blocks)."""
import numpy as np

from helpers.quant_check import make_weight

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 256, 512, 4, 2, 2, 320


def tensor_plans(type_name: str, embd_type: str = "Q8_0"):
    from modelplex_native_gpu.loader.gguf_write import TensorPlan

    head_dim = HIDDEN // HEADS
    shapes = {"attn_q.weight": (HIDDEN, HIDDEN), "attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
              "attn_v.weight": (KV_HEADS * head_dim, HIDDEN), "attn_output.weight": (HIDDEN, HIDDEN),
              "ffn_gate.weight": (FFN, HIDDEN), "ffn_up.weight": (FFN, HIDDEN), "ffn_down.weight": (HIDDEN, FFN)}
    plans = [TensorPlan("token_embd.weight", (VOCAB, HIDDEN), embd_type,
                        lambda: make_weight(embd_type, VOCAB, HIDDEN, seed=1), raw=True)]
    for i in range(LAYERS):
        for j, (name, shape) in enumerate(shapes.items()):
            seed = 100 * i + j + 2
            plans.append(TensorPlan(f"blk.{i}.{name}", shape, type_name,
                                    lambda shape=shape, seed=seed: make_weight(type_name, *shape, seed=seed), raw=True))
        for name in ("attn_norm.weight", "ffn_norm.weight"):
            plans.append(TensorPlan(f"blk.{i}.{name}", (HIDDEN,), "F32", lambda: np.ones(HIDDEN, np.float32), raw=True))
    plans.append(TensorPlan("output_norm.weight", (HIDDEN,), "F32", lambda: np.ones(HIDDEN, np.float32), raw=True))
    return plans


def metadata(writer):
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_context_length(512)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def write_tiny(path, type_name: str, embd_type: str = "Q8_0", plans=None) -> str:
    from modelplex_native_gpu.loader import gguf_write

    gguf_write.write(str(path), "llama", plans or tensor_plans(type_name, embd_type), metadata)
    return str(path)
