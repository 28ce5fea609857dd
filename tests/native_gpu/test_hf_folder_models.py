"""HF-folder loading for Llama-family variants (tiny random models): greedy output equals HF's."""
import pytest
import torch

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)


def make_model(kind):
    import transformers

    torch.manual_seed(0)
    if kind == "qwen2":  # q/k/v biases
        config = transformers.Qwen2Config(**TINY, tie_word_embeddings=True)
        return transformers.Qwen2ForCausalLM(config)
    if kind == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**TINY, tie_word_embeddings=False))
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}
    config = transformers.LlamaConfig(**TINY, tie_word_embeddings=False, rope_parameters=rope, head_dim=24)
    return transformers.LlamaForCausalLM(config)  # llama3 rope scaling, head size 24 (not a power of two)


@pytest.mark.parametrize("kind", ["llama3_rope", "qwen2", "mistral"])
def test_hf_folder_greedy_matches_transformers(kind, tmp_path):
    model = make_model(kind).eval()
    model.save_pretrained(tmp_path)
    prompts = [[5, 17, 99, 3, 42, 8, 250, 1, 77, 13] * 5, [9, 9, 200, 31]]
    with torch.inference_mode():
        want = [model.generate(torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    engine = LLMEngine(EngineConfig(model=str(tmp_path), device="cpu", dtype="float32", max_model_len=128,
                                    kv_cache_memory_bytes=8 << 20, skip_tokenizer_init=True))
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert [o[0].token_ids for o in outs] == want
