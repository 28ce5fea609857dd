"""OpenVINO GenAI's ContinuousBatchingPipeline on CPU: the best fp32 batch peer on the host of
../shared/bench/peers/RESULTS.md. Runs in our own venv (openvino-genai is the openvino backend's) on the IR
`modelplex convert-openvino` writes (the example repository's smollm2_ov: the GGUF's weights, as our engine
reads), with the shared script's settings: 2,048 batched tokens, dynamic split-fuse, the requested precision
for inference and KV cache. Prefix caching is off: the pipeline cannot drop its cache between runs, and a
second run of the same prompts would hit it (our engine and vLLM count hits within one run).
"""
import time

import runner


def main():
    args = runner.parse_args()
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    requests = runner.load_requests(args.workload)
    scheduler = og.SchedulerConfig()
    scheduler.cache_size = 2  # GB
    scheduler.max_num_seqs, scheduler.max_num_batched_tokens = 256, 2048
    scheduler.enable_prefix_caching, scheduler.dynamic_split_fuse = False, True
    precision = {"float32": "f32", "bfloat16": "bf16"}[args.dtype]
    properties = {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": precision,
                  "KV_CACHE_PRECISION": precision}
    t0 = time.perf_counter()
    pipe = og.ContinuousBatchingPipeline(args.model, scheduler, "CPU", properties)
    load_s = time.perf_counter() - t0

    def run_batch(reqs):
        inputs = [ov.Tensor(np.array([r["prompt_ids"]], dtype=np.int64)) for r in reqs]
        configs = []
        for r in reqs:
            config = og.GenerationConfig()
            config.max_new_tokens = config.min_new_tokens = r["max_tokens"]
            config.ignore_eos, config.do_sample = True, False
            configs.append(config)
        return sum(len(out.m_generation_ids[0]) for out in pipe.generate(inputs, configs))

    run_batch(requests[:4])  # warm-up: compile, first allocations
    runner.serve({"peer": "openvino-genai", "version": og.__version__, "load_s": load_s,
                  "precision": f"{args.dtype} (INFERENCE_PRECISION_HINT {precision})"}, run_batch, requests)


if __name__ == "__main__":
    main()
