"""BlockPool and KVCacheManager: exact block ids, ref counts, LRU eviction order, no leaks."""
import pytest

from modelplex_native_gpu.engine.block_pool import BlockPool
from modelplex_native_gpu.engine.kv_cache_manager import KVCacheManager
from modelplex_native_gpu.engine.request import EngineRequest
from modelplex_native_gpu.engine.sampling_params import SamplingParams

BS = 4


def check_invariant(pool: BlockPool):
    assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks - 1
    used = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
    assert used == pool.num_used_blocks
    assert pool.null_block.ref_cnt == 1 and 0 not in pool.free_queue.block_ids()


def request(rid, tokens, salt=None, max_tokens=4):
    return EngineRequest(rid, list(tokens), SamplingParams(max_tokens=max_tokens), eos_token_id=None,
                         cache_salt=salt)


def reserved(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.blocks if b.is_reserved]


def grow(kv: KVCacheManager, r: EngineRequest, num_tokens: int):
    """Decode `num_tokens` tokens for r (its prompt computed), allocating as the scheduler does."""
    for _ in range(num_tokens):
        r.num_computed_tokens = r.num_tokens
        r.append_token(99)
        assert kv.allocate_slots(r, 1)


def test_pool_hands_out_blocks_front_first_and_frees_to_the_back():
    pool = BlockPool(6)
    assert pool.free_queue.block_ids() == [1, 2, 3, 4, 5]
    a = pool.get_new_blocks(2)
    b = pool.get_new_blocks(1)
    assert [x.block_id for x in a + b] == [1, 2, 3] and all(x.ref_cnt == 1 for x in a + b)
    pool.free_blocks(reversed(a))
    assert pool.free_queue.block_ids() == [4, 5, 2, 1]
    pool.touch([a[0]])  # a cache hit on a free block takes it out of the middle of the queue
    assert a[0].ref_cnt == 1 and pool.free_queue.block_ids() == [4, 5, 2]
    pool.touch([b[0]])
    assert b[0].ref_cnt == 2
    check_invariant(pool)
    pool.free_blocks([a[0], b[0], b[0]])
    assert pool.free_queue.block_ids() == [4, 5, 2, 1, 3]
    check_invariant(pool)


def test_cached_block_is_evicted_only_when_reused_in_lru_order():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(3)
    for i, block in enumerate(blocks):
        pool.cache_block(block, (None, (i,), None))
    pool.free_blocks([blocks[1], blocks[0], blocks[2]])
    assert pool.free_queue.block_ids() == [2, 1, 3]
    assert pool.get_cached_block((None, (0,), None)) is blocks[0]  # still cached while free
    (reused,) = pool.get_new_blocks(1)
    assert reused.block_id == 2 and reused.block_hash is None
    assert pool.get_cached_block((None, (1,), None)) is None
    assert pool.get_cached_block((None, (0,), None)) is blocks[0]
    check_invariant(pool)


def test_manager_allocates_exact_blocks_and_frees_tail_first():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    r = request("a", range(10))
    assert kv.allocate_slots(r, 10)
    assert kv.block_table("a") == [1, 2, 3]
    r.num_computed_tokens = 10
    r.append_token(99)
    assert kv.allocate_slots(r, 1)  # token 11 still fits block 3
    assert kv.block_table("a") == [1, 2, 3]
    for t in (100, 101):
        r.num_computed_tokens += 1
        r.append_token(t)
        assert kv.allocate_slots(r, 1)
    assert kv.block_table("a") == [1, 2, 3, 4]
    kv.free(r)
    assert kv.block_pool.free_queue.block_ids() == [5, 6, 7, 4, 3, 2, 1]
    check_invariant(kv.block_pool)


def test_prefix_hits_share_blocks_and_count_references():
    kv = KVCacheManager(num_blocks=10, block_size=BS)
    a = request("a", range(10))
    assert kv.get_computed_blocks(a) == ([[]], 0)
    assert kv.allocate_slots(a, 10)  # blocks [1, 2] are full and get cached, 3 is partial
    b = request("b", list(range(8)) + [50, 51, 52])
    hits, num_hit = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits[0]] == [1, 2] and num_hit == 8
    assert kv.allocate_slots(b, 3, hits)
    kv.record_prefix_lookup(b.num_tokens, num_hit)
    assert kv.block_table("b") == [1, 2, 5]  # block 4 stays reserved for a's 4th block (10 + 4 tokens)
    assert [kv.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4, 5)] == [2, 2, 1, 0, 1]
    assert kv.prefix_cache_hit_rate == pytest.approx(8 / 11)
    assert reserved(kv.block_pool) == [4, 6]
    kv.free(a)
    kv.free(b)
    assert kv.block_pool.free_queue.block_ids() == [7, 8, 9, 4, 6, 3, 5, 2, 1]
    assert reserved(kv.block_pool) == []  # a finished table's reservation is released
    check_invariant(kv.block_pool)


def test_full_prompt_hit_leaves_last_token_to_compute_and_salt_separates():
    kv = KVCacheManager(num_blocks=10, block_size=BS)
    a = request("a", range(8))
    kv.allocate_slots(a, 8)
    same = request("same", range(8))
    hits, num_hit = kv.get_computed_blocks(same)
    assert [h.block_id for h in hits[0]] == [1] and num_hit == 4  # block 2 holds the last token
    salted = request("salted", range(8), salt="adapter-1")
    assert kv.get_computed_blocks(salted) == ([[]], 0)
    kv.free(a)
    check_invariant(kv.block_pool)


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a = request("a", range(8))
    assert kv.allocate_slots(a, 8)
    kv.free(a)  # blocks 1, 2 are free but cached
    b = request("b", list(range(8)) + list(range(100, 112)))
    hits, _ = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits[0]] == [1, 2]
    assert not kv.allocate_slots(b, 12, hits)  # needs 3 more blocks, only block 3 is not a hit
    assert [blk.ref_cnt for blk in kv.block_pool.blocks[1:]] == [0, 0, 0]
    assert kv.block_table("b") == [] and kv.num_free_blocks == 3
    check_invariant(kv.block_pool)


def test_hits_in_the_free_queue_are_not_handed_out_as_new_blocks():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    a, c = request("a", range(4)), request("c", range(100, 104))
    assert kv.allocate_slots(a, 4)
    kv.free(a)
    assert kv.allocate_slots(c, 4)
    kv.free(c)
    assert kv.block_pool.free_queue.block_ids() == [1, 2]  # a's cached block first in line for eviction
    b = request("b", list(range(4)) + [50, 51, 52, 53])
    hits, _ = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits[0]] == [1]
    assert kv.allocate_slots(b, 4, hits)
    assert kv.block_table("b") == [1, 2]
    check_invariant(kv.block_pool)


def test_concurrent_tables_grow_into_their_reserved_blocks():
    kv = KVCacheManager(num_blocks=32, block_size=BS)
    a, b = request("a", range(8), max_tokens=8), request("b", range(100, 108), max_tokens=8)
    assert kv.allocate_slots(a, 8) and kv.allocate_slots(b, 8)
    assert kv.block_table("a") == [1, 2] and kv.block_table("b") == [5, 6]  # 3, 4: reserved for a's growth
    assert reserved(kv.block_pool) == [3, 4, 7, 8]
    assert kv.block_pool.free_queue.block_ids()[-4:] == [3, 4, 7, 8]  # others reach them last
    for _ in range(2):  # interleaved decodes, each table one contiguous ascending run
        grow(kv, a, 4)
        grow(kv, b, 4)
    assert kv.block_table("a") == [1, 2, 3, 4] and kv.block_table("b") == [5, 6, 7, 8]
    assert reserved(kv.block_pool) == []
    check_invariant(kv.block_pool)


def test_a_new_run_starts_at_the_bottom_of_a_table_freed_tail_first():
    kv = KVCacheManager(num_blocks=6, block_size=BS, enable_prefix_caching=False)
    a = request("a", range(20), max_tokens=1)
    assert kv.allocate_slots(a, 20)
    kv.free(a)
    assert kv.block_pool.free_queue.block_ids() == [5, 4, 3, 2, 1]
    b = request("b", range(100, 111), max_tokens=1)  # 3 blocks, none to reserve
    assert kv.allocate_slots(b, 11)
    assert kv.block_table("b") == [3, 4, 5]  # ascending, not the queue's 5, 4, 3
    check_invariant(kv.block_pool)


def test_only_the_colder_half_of_the_queue_is_evicted_out_of_order():
    pool = BlockPool(9)
    blocks = pool.get_new_blocks(8)
    for i, block in enumerate(blocks):
        pool.cache_block(block, (None, (i,), None))
    pool.free_blocks(blocks[:1] + blocks[4:] + blocks[1:4])  # queue: 1, 5, 6, 7, 8, 2, 3, 4
    assert pool.free_queue.block_ids() == [1, 5, 6, 7, 8, 2, 3, 4]
    (a,) = pool.get_new_blocks(1)
    assert a.block_id == 1
    # 2 was freed 4 frees after the front (5), 7 blocks free: the younger half, so it keeps its hash and the
    # table starts a run at the front instead, which then grows into 6 (freed right after 5)
    (grown,) = pool.get_new_blocks(1, after=a)
    assert grown.block_id == 5 and pool.get_cached_block((None, (1,), None)) is blocks[1]
    (grown,) = pool.get_new_blocks(1, after=grown)
    assert grown.block_id == 6 and pool.get_cached_block((None, (5,), None)) is None
    check_invariant(pool)
