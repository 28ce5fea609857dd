"""Scheduler: token budget, decode-first order, chunked prefill, preemption (newest first), abort."""
from modelplex_native_gpu.engine.kv_cache_manager import KVCacheManager
from modelplex_native_gpu.engine.request import EngineRequest, RequestStatus
from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.engine.scheduler import Scheduler

BS = 4


def make(num_blocks=16, max_num_seqs=8, max_tokens_per_step=16, caching=False):
    kv = KVCacheManager(num_blocks, BS, caching)
    return Scheduler(kv, max_num_seqs, max_tokens_per_step, max_model_len=64), kv


def req(rid, n, max_tokens=8, priority=0, t=0.0):
    return EngineRequest(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens), eos_token_id=0,
                         priority=priority, arrival_time=t)


def step(sched, token=7):
    out = sched.schedule()
    sched.update_from_output(out, [token if r.num_computed_tokens + n == r.num_tokens else None
                                   for r, n in zip(out.requests, out.num_scheduled_tokens)])
    return out


def summary(out):
    return [(r.request_id, n) for r, n in zip(out.requests, out.num_scheduled_tokens)]


def check_invariant(kv):
    pool = kv.block_pool
    assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks - 1


def test_chunked_prefill_under_token_budget_then_decodes_first():
    sched, kv = make(max_tokens_per_step=10)
    sched.add_request(req("a", 6, t=0))
    sched.add_request(req("b", 9, t=1))
    assert summary(step(sched)) == [("a", 6), ("b", 4)]
    assert summary(step(sched)) == [("a", 1), ("b", 5)]  # a decodes before b's remaining prefill
    assert summary(step(sched)) == [("a", 1), ("b", 1)]
    assert sched.requests["a"].output_token_ids == [7, 7, 7]
    # 8 and 10 tokens computed; 3, 4 stay reserved for a's growth (6 + 8 tokens), b's run starts after them
    assert kv.block_table("a") == [1, 2] and kv.block_table("b") == [5, 6, 7]
    check_invariant(kv)


def test_max_num_seqs_and_priority_order():
    sched, kv = make(max_num_seqs=2)
    sched.add_request(req("low", 2, priority=5, t=0))
    sched.add_request(req("first", 2, t=1))
    sched.add_request(req("second", 2, t=2))
    assert summary(step(sched)) == [("first", 2), ("second", 2)]
    check_invariant(kv)


def test_preemption_frees_newest_and_resumes_with_recompute():
    sched, kv = make(num_blocks=5, max_tokens_per_step=32)  # 4 usable blocks
    sched.add_request(req("old", 8, t=0))
    sched.add_request(req("new", 7, t=1))
    assert summary(step(sched)) == [("old", 8), ("new", 7)]
    assert kv.block_table("old") == [1, 2] and kv.block_table("new") == [3, 4]
    out = step(sched)  # old needs block 3 for token 9: new is preempted and its blocks freed
    assert summary(out) == [("old", 1)] and out.preempted_request_ids == ["new"]
    new = sched.requests["new"]
    assert new.status == RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert new.output_token_ids == [7]
    assert kv.block_table("old") == [1, 2, 3] and kv.block_pool.free_queue.block_ids() == [4]  # grows in place
    sched.finish_request("old", RequestStatus.FINISHED_ABORTED)
    assert kv.num_free_blocks == 4
    assert summary(step(sched)) == [("new", 8)]  # prompt + its generated token recomputed
    assert new.output_token_ids == [7, 7]
    check_invariant(kv)


def test_abort_frees_blocks_at_once_and_stops_scheduling():
    sched, kv = make()
    sched.add_request(req("a", 5))
    sched.add_request(req("waiting", 5))
    step(sched)
    assert kv.num_free_blocks == 11
    sched.finish_request("a", RequestStatus.FINISHED_ABORTED)
    sched.finish_request("waiting", RequestStatus.FINISHED_ABORTED)
    assert kv.num_free_blocks == 15 and not sched.has_unfinished_requests()
    assert sched.schedule().is_empty
    check_invariant(kv)


def test_stops_on_eos_and_max_tokens():
    sched, kv = make()
    sched.add_request(req("eos", 3))
    sched.add_request(req("len", 3, max_tokens=2))
    step(sched, token=5)
    out = sched.schedule()
    sched.update_from_output(out, [0, 5])  # eos token id is 0
    finished = {rid for rid in ("eos", "len") if rid not in sched.requests}
    assert finished == {"eos", "len"}
    assert kv.num_free_blocks == 15
    check_invariant(kv)
