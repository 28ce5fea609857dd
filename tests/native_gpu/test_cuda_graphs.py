"""CUDA-graph decode (engine/cuda_graphs.py): the padded capture sizes, and on a GPU the same greedy
tokens and log-probabilities as eager steps while the batch shrinks through padded sizes."""
import pytest
import torch

from modelplex_native_gpu.engine.cuda_graphs import capture_sizes


def test_capture_sizes_pad_to_powers_of_two_then_multiples_of_eight():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(5) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert capture_sizes(128)[-3:] == [112, 120, 128]
    assert capture_sizes(1000)[-1] == 256


def tiny_llama(device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    from modelplex_native_gpu.loader import LoadedWeights
    from modelplex_native_gpu.models.config import ArchConfig

    values = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=256, vocab_size=512, max_position_embeddings=512, eos_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        hf = LlamaForCausalLM(LlamaConfig(**values))
    return LoadedWeights(ArchConfig.from_hf(values), dict(hf.state_dict()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_decode_matches_eager_as_the_batch_shrinks():
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    loaded = tiny_llama("cuda")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 512, (n,), generator=g).tolist() for n in (3, 17, 30, 8, 12)]
    results = {}
    for eager in (True, False):
        engine = LLMEngine(EngineConfig(device="cuda", dtype="float32", max_model_len=256, skip_tokenizer_init=True,
                                        kv_cache_memory_bytes=32 << 20, enforce_eager=eager), loaded=loaded)
        for i, prompt in enumerate(prompts):  # different lengths: sequences finish one by one, 5 -> 1 rows
            engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=6 + 7 * i, ignore_eos=True,
                                                               logprobs=3))
        outputs = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out
        results[eager] = outputs
        if not eager:
            assert sorted(engine.runner.graphs.graphs) == [1, 2, 4, 8], "padded sizes 1, 2, 4 and 8 (for 5 and 3)"
    for rid, eager_out in results[True].items():
        graph_out = results[False][rid]
        assert graph_out.token_ids == eager_out.token_ids, rid
        for a, b in zip(graph_out.new_logprobs, eager_out.new_logprobs):
            assert a.keys() == b.keys() and max(abs(a[t] - b[t]) for t in a) < 1e-4, rid


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_async_scheduling_with_graphs_matches_the_synchronous_eager_loop():
    """Step N+1 replays its graph with input ids written on the device from step N's sampled ids."""
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    loaded = tiny_llama("cuda")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(2, 512, (n,), generator=g).tolist() for n in (5, 21, 40, 9, 14, 3)]
    results = []
    for eager, async_scheduling in ((True, False), (False, True), (True, True)):
        engine = LLMEngine(EngineConfig(device="cuda", dtype="float32", max_model_len=256, skip_tokenizer_init=True,
                                        kv_cache_memory_bytes=32 << 20, enforce_eager=eager,
                                        async_scheduling=async_scheduling), loaded=loaded)
        params = [SamplingParams(temperature=0, max_tokens=4 + 9 * i, ignore_eos=True) for i in range(len(prompts))]
        params[2] = SamplingParams(temperature=0, max_tokens=30, stop_token_ids=list(range(2, 512, 7)))
        outputs = {}
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(f"r{i}", prompt, p)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = (out.token_ids, out.finish_reason)
        assert engine.kv_cache_manager.block_pool.num_used_blocks == 0
        results.append(outputs)
    assert results[1] == results[0] and results[2] == results[0]
