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
