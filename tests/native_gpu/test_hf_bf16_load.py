"""bf16 safetensors checkpoints load at bf16 tensor by tensor: no fp32 copy of the model, no copy of the whole
checkpoint beside it (peak RSS near the final one), and the same model as one given whole in memory."""
import json

import torch
from helpers.load_memory import measure_load

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.loader import LoadedWeights, load_weights

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0)


def write_checkpoint(folder, shape: dict, seed: int = 0, std: float = 0.05) -> dict[str, torch.Tensor]:
    """A random bf16 Llama checkpoint of `shape` (HF names, one safetensors file, config.json)."""
    from safetensors.torch import save_file

    h, f, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_key_value_heads"]
    head_dim = h // shape["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (shape["vocab_size"], h), "model.norm.weight": (h,)}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv * head_dim, h),
                       p + "self_attn.v_proj.weight": (kv * head_dim, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    g = torch.Generator().manual_seed(seed)
    tensors = {name: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * std).to(torch.bfloat16)
               for name, s in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    config = dict(shape, architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
                  max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


def test_bf16_checkpoint_loads_without_an_fp32_copy(tmp_path):
    """SmolLM2-135M's shape (270 MB of bf16): what loading peaks at stays within 1.2x of what stays resident.
    Before tensor-by-tensor reads and bf16 parameters, the mapped file plus an fp32 model peaked at ~3x."""
    write_checkpoint(tmp_path, SMOLLM2)
    m = measure_load(model=str(tmp_path), device="cpu", dtype="bfloat16", max_model_len=64,
                     kv_cache_memory_bytes=4 << 20, skip_tokenizer_init=True)
    assert m.dtype == "bfloat16"
    assert m.weight_bytes > 250e6  # bf16: 2 bytes a weight (fp32 would be > 500 MB)
    assert m.after - m.before >= 0.9 * m.weight_bytes, m  # the weights are resident ...
    assert m.peak_over_final <= 1.2, m  # ... and loading peaked near them


def test_tensors_read_from_the_file_make_the_same_model_as_tensors_in_memory(tmp_path):
    shape = dict(SMOLLM2, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256)
    tensors = write_checkpoint(tmp_path, shape, seed=1, std=0.5)
    lazy = load_weights(str(tmp_path))
    assert all(hasattr(w, "load") for w in lazy.weights.values())  # nothing read before the model takes it
    settings = dict(model=str(tmp_path), device="cpu", dtype="bfloat16", max_model_len=128,
                    kv_cache_memory_bytes=4 << 20, skip_tokenizer_init=True)
    from_file = LLMEngine(EngineConfig(**settings), loaded=lazy)
    in_memory = LLMEngine(EngineConfig(**settings), loaded=LoadedWeights(lazy.config, tensors))
    prompts = [[5, 17, 99, 3, 42, 8, 250, 1, 77, 13] * 3, [9, 9, 200, 31]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    got = [o[0].token_ids for o in from_file.generate(prompts, params)]
    assert got == [o[0].token_ids for o in in_memory.generate(prompts, params)]
    assert len(set(got[0])) > 1  # a real continuation, not one token repeated
