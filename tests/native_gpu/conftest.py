"""Make the backend importable from a source checkout and share the real-model fixtures (loaded once)."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def ops():
    """torch.ops.modelplex_cpu: the compiled CPU ops (built on first use)."""
    from modelplex_native_gpu.kernels import cpu

    compiled = cpu.compiled_ops()
    if compiled is None:
        pytest.fail("the CPU ops did not build (gcc and ninja are installed by `make`)")
    return compiled


@pytest.fixture(scope="session")
def loaded_weights(gguf_path):
    from modelplex_native_gpu.loader import load_weights

    return load_weights(gguf_path).dequantized()  # the token-exact fp32 engines; quantized tests load their own


@pytest.fixture(scope="session")
def tokenizer(gguf_path):
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    return load_tokenizer(gguf_path)


@pytest.fixture(scope="session")
def make_engine(gguf_path, loaded_weights, tokenizer):
    """Build an fp32 CPU engine on the shared weights; keyword arguments override EngineConfig fields."""
    import torch

    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    torch.set_num_threads(2)

    def make(**overrides):
        settings = dict(model=gguf_path, device="cpu", dtype="float32", max_model_len=512,
                        kv_cache_memory_bytes=64 << 20)
        settings.update(overrides)
        return LLMEngine(EngineConfig(**settings), tokenizer=tokenizer, loaded=loaded_weights)

    return make


# ---------------------------------------------------------------- tiny random models of each family

_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.1, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)


def _tiny_config(family: str):
    """The family's peculiarities switched on: sliding windows (12 tokens) shorter than the test prompts,
    soft-capping, fused projections, LongRoPE with partial rotary dims, Gemma 3's two RoPE bases."""
    import torch
    import transformers

    if family == "qwen3":  # q/k norms, tied embeddings (as Qwen3-0.6B)
        return transformers.Qwen3Config(**_TINY, head_dim=16, num_hidden_layers=2, tie_word_embeddings=True)
    if family == "gemma2":  # alternating sliding/global, both soft-caps, query_pre_attn_scalar != head_dim
        return transformers.Gemma2Config(**_TINY, head_dim=16, num_hidden_layers=4, sliding_window=12,
                                         query_pre_attn_scalar=32, attn_logit_softcapping=0.5,
                                         final_logit_softcapping=3.0)
    if family == "gemma3":  # 3 sliding layers : 1 global, local/global RoPE bases, linear scaling on global
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
        return transformers.Gemma3TextConfig(**_TINY, head_dim=16, num_hidden_layers=4, sliding_window=12,
                                             layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                             rope_parameters=rope, query_pre_attn_scalar=16)
    if family == "phi3":  # fused qkv/gate_up, LongRoPE (original context 32), 3/4 rotary dims, a window
        g = torch.Generator().manual_seed(0)
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "long_factor": (1 + 3 * torch.rand(6, generator=g)).tolist(),
                "short_factor": (1 + torch.rand(6, generator=g)).tolist(),
                "original_max_position_embeddings": 32}
        return transformers.Phi3Config(**_TINY, num_hidden_layers=2, sliding_window=24, rope_parameters=rope,
                                       original_max_position_embeddings=32)
    raise ValueError(family)


@pytest.fixture(scope="session")
def tiny_family_model(tmp_path_factory):
    """tiny_family_model(family) -> (fp32 transformers model, its saved HF folder), built once per family.
    Norm weights are randomized so Gemma's +1 offset and the q/k norms change the output."""
    import torch
    import transformers

    classes = {"qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
               "phi3": "Phi3ForCausalLM"}
    built = {}

    def make(family: str):
        if family not in built:
            torch.manual_seed(0)
            config = _tiny_config(family)
            config._attn_implementation = "eager"  # HF's reference math (Gemma 2's soft-cap needs it)
            model = getattr(transformers, classes[family])(config).eval()
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if name.endswith("norm.weight"):
                        param.normal_(0.0 if family.startswith("gemma") else 1.0, 0.3)
            folder = tmp_path_factory.mktemp(family)
            model.save_pretrained(folder)
            built[family] = model, str(folder)
        return built[family]

    return make


@pytest.fixture(scope="session")
def engine_for():
    """engine_for(model_path, **EngineConfig overrides) -> a small fp32 CPU engine without a tokenizer
    (block size 8, max_model_len 128), for the tiny family models."""
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    def make(model_path, **overrides):
        settings = dict(model=model_path, device="cpu", dtype="float32", max_model_len=128, block_size=8,
                        kv_cache_memory_bytes=4 << 20, skip_tokenizer_init=True)
        settings.update(overrides)
        return LLMEngine(EngineConfig(**settings))

    return make


@pytest.fixture(scope="session")
def hf_greedy():
    """hf_greedy(model, ids, max_new) -> transformers' greedy continuation (token ids)."""
    import torch

    def generate(model, ids, max_new):
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, pad_token_id=0)
        return out[0, len(ids):].tolist()

    return generate


@pytest.fixture(scope="session")
def write_gguf():
    """write_gguf(model, path): the model as llama.cpp's convert_hf_to_gguf.py writes it (F32 tensors):
    tensor names from gguf-py's own HF -> GGUF map, Gemma norms stored with +1, the family's metadata keys."""
    def write(model, path, quantize: str | None = None):
        """`quantize` ("Q8_0", ...): the linear layers' and the embedding's weights in that type."""
        import gguf
        import numpy as np

        config, family = model.config, model.config.model_type.replace("_text", "")
        arch = {"qwen3": gguf.MODEL_ARCH.QWEN3, "gemma2": gguf.MODEL_ARCH.GEMMA2, "gemma3": gguf.MODEL_ARCH.GEMMA3,
                "phi3": gguf.MODEL_ARCH.PHI3}[family]
        writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
        _write_gguf_metadata(writer, config, family)
        names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
        for name, tensor in model.state_dict().items():
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            data = tensor.float()
            if family.startswith("gemma") and name.endswith("norm.weight"):
                data = data + 1
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if quantize and data.dim() == 2 and not name.endswith("norm.weight"):
                qtype = gguf.GGMLQuantizationType[quantize]
                writer.add_tensor(gguf_name, gguf.quants.quantize(data.numpy(), qtype), raw_dtype=qtype)
                continue
            writer.add_tensor(gguf_name, data.numpy())
        if family == "phi3":
            rope = config.rope_parameters
            writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    return write


def _write_gguf_metadata(writer, config, family: str):
    import math

    import gguf

    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    rope = config.rope_parameters
    if family == "gemma3":
        rope = rope["full_attention"]
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
    writer.add_rope_freq_base(rope["rope_theta"])
    if family.startswith("gemma"):
        writer.add_sliding_window(config.sliding_window)
        writer.add_attention_scale(config.query_pre_attn_scalar ** -0.5)
        if config.attn_logit_softcapping:
            writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        if config.final_logit_softcapping:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
    if family == "phi3":
        original = rope["original_max_position_embeddings"]
        writer.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
        writer.add_rope_scaling_orig_ctx_len(original)
        scale = config.max_position_embeddings / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        writer.add_sliding_window(config.sliding_window or 0)

