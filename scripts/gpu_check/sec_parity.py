"""Engine vs transformers on the same device and weights: log-probabilities (logits up to a per-row
constant) of every generated position within a stated tolerance; greedy tokens identical in fp32."""
from __future__ import annotations

import torch
from random_models import Shape, loaded_weights, make_engine, make_hf_model, random_prompts

# Tolerances on |engine log-prob - transformers log-prob| over the top-5 tokens of every position.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}
NUM_NEW_TOKENS = 24
TOP = 5


def shapes(dry_run: bool) -> list[Shape]:
    if dry_run:
        return [Shape("llama-tiny", "LlamaForCausalLM", 64, 2, 4, 2, 128, 256),
                Shape("qwen2-tiny-hd24", "Qwen2ForCausalLM", 96, 2, 4, 2, 160, 256)]
    return [Shape("llama-small", "LlamaForCausalLM", 512, 4, 8, 2, 1408, 4096),
            Shape("qwen2-small-hd48", "Qwen2ForCausalLM", 384, 4, 8, 4, 1024, 4096, tied=True)]


def run(check, report) -> None:
    lengths = [5, 17, 33] if check.dry_run else [5, 17, 33, 64, 100]
    for shape in shapes(check.dry_run):
        for dtype in ("float32", "bfloat16"):
            compare(check, report, shape, dtype, random_prompts(lengths, shape.vocab, seed=3))


def generate(engine, prompts, params) -> list[tuple[list[int], list[dict[int, float]]]]:
    """Each prompt's tokens and the log-probabilities of every step (collected from the step outputs)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    logprobs: dict[str, list] = {str(i): [] for i in range(len(prompts))}
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            logprobs[out.request_id] += out.new_logprobs
            if out.finished:
                tokens[out.request_id] = out.token_ids
    return [(tokens[str(i)], logprobs[str(i)]) for i in range(len(prompts))]


def compare(check, report, shape: Shape, dtype: str, prompts: list[list[int]]) -> None:
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    hf = make_hf_model(shape, dtype, check.device, seed=0)
    engine = make_engine(loaded_weights(hf, shape), check.device, dtype, max_model_len=256,
                         kv_cache_memory_bytes=64 << 20)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=TOP)
    worst, mismatches = 0.0, []
    for prompt, (tokens, step_logprobs) in zip(prompts, generate(engine, prompts, params)):
        sequence = torch.tensor([prompt + tokens], device=check.device)
        with torch.inference_mode():  # teacher-forced: one forward over prompt + the engine's tokens
            logits = hf(sequence).logits[0, len(prompt) - 1:-1].float()
        reference = torch.log_softmax(logits, dim=-1)
        for step, (token, logprobs) in enumerate(zip(tokens, step_logprobs)):
            for tid, value in logprobs.items():
                worst = max(worst, abs(value - float(reference[step, tid])))
            best = reference[step].topk(2)
            if int(best.indices[0]) != token:
                margin = float(best.values[0] - best.values[1])
                mismatches.append(f"prompt of {len(prompt)}: step {step} engine {token} vs {int(best.indices[0])} "
                                  f"(transformers' top-2 margin {margin:.2e})")
                break
    label = f"{shape.name} {dtype}"
    report.result(f"{label} max |dlogprob|", round(worst, 6), ok=worst <= TOLERANCE[dtype],
                  text=f"{label}: max |log-prob difference| {worst:.2e} (tolerance {TOLERANCE[dtype]:g}) "
                       f"over {len(prompts)} prompts x {NUM_NEW_TOKENS} tokens, top-{TOP}")
    same = len(prompts) - len(mismatches)
    greedy_ok = not mismatches if dtype == "float32" else None
    report.result(f"{label} greedy identical", f"{same}/{len(prompts)}", ok=greedy_ok,
                  text=f"{label}: greedy tokens identical to transformers for {same}/{len(prompts)} prompts"
                       + ("" if dtype == "float32" else " (informative in bf16)"))
    for line in mismatches:
        report.note("  first difference: " + line)
    del engine, hf
    if check.device.startswith("cuda"):
        torch.cuda.empty_cache()
