"""KV-cache groups with sliding windows: a Gemma-style model's blocks outside every layer's window go back
to the pool, so its KV usage on a long prompt is bounded by the window for the sliding layers."""
from modelplex_native_gpu.engine.kv_cache_groups import KVCacheGroup, group_layers
from modelplex_native_gpu.engine.kv_cache_manager import KVCacheManager, cdiv
from modelplex_native_gpu.engine.request import EngineRequest
from modelplex_native_gpu.engine.sampling_params import SamplingParams

BS, WINDOW, BUDGET = 8, 12, 16


def test_layers_group_by_window_in_equal_sizes():
    assert group_layers([None] * 3) == [KVCacheGroup((0, 1, 2))]
    assert group_layers([12, None, 12, None]) == [KVCacheGroup((1, 3)), KVCacheGroup((0, 2), 12)]
    assert group_layers([12, 12, 12, None, 12, 12]) == [KVCacheGroup((3,))] + [KVCacheGroup((i,), 12)
                                                                              for i in (0, 1, 2, 4, 5)]


def test_sliding_group_frees_blocks_out_of_the_window_and_hits_need_only_the_window():
    groups = [KVCacheGroup((1,)), KVCacheGroup((0,), WINDOW)]
    kv = KVCacheManager(num_blocks=32, block_size=BS, groups=groups)
    a = EngineRequest("a", list(range(40)), SamplingParams(max_tokens=4), eos_token_id=None)
    assert kv.allocate_slots(a, 16)
    a.num_computed_tokens = 16
    assert kv.allocate_slots(a, 16)  # token 16 reads 5..16: block 0 (tokens 0-7) stays
    assert kv.block_tables("a") == [[1, 2, 3, 4], [7, 8, 9, 10]]  # each group grows into its reserved run
    a.num_computed_tokens = 32
    assert kv.allocate_slots(a, 8)  # token 32 reads 21..32: blocks 0 and 1 of the sliding group go back
    assert kv.block_tables("a") == [[1, 2, 3, 4, 5], [0, 0, 9, 10, 11]]
    assert kv.block_pool.free_queue.block_ids()[-2:] == [7, 8]  # still cached: a later prefix may hit them
    b = EngineRequest("b", list(range(33)) + [99], SamplingParams(max_tokens=4), eos_token_id=None)
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 32 and [blk.block_id for blk in hits[0]] == [1, 2, 3, 4]
    assert [blk.block_id for blk in hits[1]] == [0, 0, 9, 10]  # the window of token 32: blocks 2 and 3


def test_long_prompt_kv_usage_bounded_by_the_window(tiny_family_model, hf_greedy, engine_for):
    model, folder = tiny_family_model("gemma2")  # window 12; layers 0, 2 sliding, 1, 3 global
    prompt = [(3 * i) % 250 + 3 for i in range(110)]
    engine = engine_for(folder, max_num_batched_tokens=BUDGET, enable_prefix_caching=False)
    kv, null = engine.kv_cache_manager, engine.kv_cache_manager.block_pool.null_block
    assert [g.sliding_window for g in kv.groups] == [None, WINDOW]
    engine.add_request("long", prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    peak_sliding, outputs = 0, []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        if "long" in kv.req_to_blocks:
            full, sliding = kv.req_to_blocks["long"]
            live = sum(block is not null for block in sliding)
            peak_sliding = max(peak_sliding, live)
            assert kv.block_pool.num_used_blocks == len(full) + live  # nothing else is held
    # Per step: the window before the first scheduled token plus the chunk, over block boundaries.
    assert peak_sliding <= cdiv(WINDOW - 1 + BUDGET, BS) + 1 < cdiv(len(prompt) + 12, BS)
    assert outputs[-1].token_ids == hf_greedy(model, prompt, 12)
