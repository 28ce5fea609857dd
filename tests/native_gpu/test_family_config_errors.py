"""A config.json field the family's code does not support fails the load, naming the field and the value,
before any weight is read; the error is the engine's typed ModelLoadError."""
import json

import pytest

from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
from modelplex_native_gpu.errors import ModelLoadError

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


@pytest.mark.parametrize("config, message", [
    ({"architectures": ["Qwen3ForCausalLM"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "rope_scaling.rope_type: unsupported value 'yarn'"),
    ({"architectures": ["Qwen3ForCausalLM"], "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e6}},
     "rope_parameters.rope_type: unsupported value 'dynamic'"),
    ({"architectures": ["Gemma3ForCausalLM"], "sliding_window": 8,
      "rope_parameters": {"full_attention": {"rope_type": "ntk", "rope_theta": 1e6}, "sliding_attention": {}}},
     "rope_parameters.full_attention.rope_type: unsupported value 'ntk'"),
    ({"architectures": ["Gemma2ForCausalLM"], "hidden_activation": "relu", "sliding_window": 8},
     "hidden_activation: unsupported value 'relu'"),
    ({"architectures": ["Gemma2ForCausalLM"], "sliding_window": 8,
      "layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types: unsupported value 'chunked_attention'"),
    ({"architectures": ["Gemma3ForCausalLM"], "use_bidirectional_attention": True},
     "use_bidirectional_attention: unsupported value True"),
    ({"architectures": ["Phi3SmallForCausalLM"]}, "architectures: unsupported architecture 'Phi3SmallForCausalLM'"),
])
def test_unsupported_field_fails_the_load_naming_it(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **config}))
    with pytest.raises(ModelLoadError) as error:
        LLMEngine(EngineConfig(model=str(tmp_path), device="cpu", dtype="float32", skip_tokenizer_init=True))
    assert message in str(error.value)
