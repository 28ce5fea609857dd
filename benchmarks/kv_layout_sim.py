"""KV block layout over rounds without a model (issue 23): the real Scheduler and KVCacheManager driven with
llm_offline's variable subset (first 32 requests) round after round, each round with its own cache salt as
llm_offline's; prints the blocks per contiguous ascending run in the tables decode-only steps read. Not a test.

  .venv/bin/python benchmarks/kv_layout_sim.py --rounds 4                 # the pool as it is
  .venv/bin/python benchmarks/kv_layout_sim.py --cold all                 # every free block counts as cold
  .venv/bin/python benchmarks/kv_layout_sim.py --cold 0.75 --block-size 32
  .venv/bin/python benchmarks/kv_layout_sim.py --reset                  # prefix cache forgotten between rounds

`--cold`: which free cached blocks a table may grow into or a run may start below (BlockPool._is_cold):
`pool` = as shipped (freed before about the older half of the free queue), `all`, or a fraction of the queue.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import llm_workloads as W

BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M fp32: K+V, 30 layers, 3 KV heads, head size 64


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--no-caching", action="store_true")
    p.add_argument("--cold", default="pool")
    p.add_argument("--reset", action="store_true", help="forget the prefix cache (its salted blocks) between rounds")
    args = p.parse_args()
    from modelplex_native_gpu.engine.block_pool import BlockPool
    from modelplex_native_gpu.engine.kv_cache_manager import KVCacheManager
    from modelplex_native_gpu.engine.request import EngineRequest
    from modelplex_native_gpu.engine.sampling_params import SamplingParams
    from modelplex_native_gpu.engine.scheduler import Scheduler

    if args.cold == "all":
        BlockPool._is_cold = lambda self, b: b.ref_cnt == 0
    elif args.cold != "pool":
        share = float(args.cold)
        BlockPool._is_cold = lambda self, b: b.ref_cnt == 0 and (
            b.block_hash is None or b.freed_at - self.free_queue.front().freed_at < self.num_free_blocks * share)
    kv = KVCacheManager((1 << 30) // (BYTES_PER_TOKEN * args.block_size), args.block_size, not args.no_caching)
    scheduler = Scheduler(kv, 256, 256, max_model_len=2048)
    items = W.variable_workload()[:32]
    for r in range(args.rounds):
        if args.reset:
            assert kv.block_pool.reset_prefix_cache()
        for i, item in enumerate(items):
            params = SamplingParams(temperature=0, max_tokens=item.max_tokens, ignore_eos=True)
            scheduler.add_request(EngineRequest(f"{r}-{i}", item.prompt_ids, params, cache_salt=f"round-{r}"))
        blocks = runs = 0
        while scheduler.waiting or scheduler.running:
            out = scheduler.schedule()
            if out.requests and all(n == 1 for n in out.num_scheduled_tokens):
                for tables in out.block_tables:
                    t = tables[0]
                    blocks += len(t)
                    runs += 1 + sum(b != a + 1 for a, b in zip(t, t[1:]))
            scheduler.update_from_output(out, [7 if r.num_computed_tokens + n >= r.num_tokens else None
                                               for r, n in zip(out.requests, out.num_scheduled_tokens)])
        print(f"block size {args.block_size}, caching {not args.no_caching}, cold {args.cold}, reset {args.reset}, round {r + 1}: "
              f"{blocks / max(runs, 1):.2f} blocks per run", flush=True)


if __name__ == "__main__":
    main()
