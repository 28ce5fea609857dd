"""onnxruntime-genai static batches (its Generator takes at most 32 sequences; prompts of one batch must
share a length, so this runner is for the fixed 64 x 128 workload). Model from its builder (-p fp32 -e cpu)."""
import json
import time

import runner


def main():
    args = runner.parse_args()
    import numpy as np
    import onnxruntime_genai as og

    requests = runner.load_requests(args.workload)
    t0 = time.perf_counter()
    cfg = og.Config(args.model)
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": args.threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(cfg)
    load_s = time.perf_counter() - t0

    def run_batch(reqs, batch_size=32):
        generated = 0
        for i in range(0, len(reqs), batch_size):
            chunk = reqs[i:i + batch_size]
            prompt_len, new = len(chunk[0]["prompt_ids"]), chunk[0]["max_tokens"]
            assert all(len(r["prompt_ids"]) == prompt_len and r["max_tokens"] == new for r in chunk)
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=prompt_len + new, min_length=prompt_len + new, do_sample=False,
                                      batch_size=len(chunk))
            gen = og.Generator(model, params)
            gen.append_tokens(np.array([r["prompt_ids"] for r in chunk], dtype=np.int32))
            steps = 0
            while not gen.is_done() and steps < new:
                gen.generate_next_token()
                steps += 1
            generated += steps * len(chunk)
        return generated

    run_batch(requests[:2], batch_size=2)  # warm-up
    runner.serve({"peer": "onnxruntime-genai", "version": og.__version__, "load_s": load_s}, run_batch, requests)


if __name__ == "__main__":
    main()
