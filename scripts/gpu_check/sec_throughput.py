"""Throughput on a Llama-3.2-1B-shaped random model in bf16: single-stream decode against the HBM bound
(weight bytes / measured copy bandwidth), batch-64 against transformers `generate`, and a batch mixing 8
LoRA adapters; each engine figure with CUDA graphs and eager."""
from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from random_models import LLAMA_3_2_1B, Shape, loaded_weights, make_engine, make_hf_model, random_prompts


@dataclass
class Sizes:
    shape: Shape
    batch: int
    prompt_len: int
    new_tokens: int
    single_new_tokens: int
    num_adapters: int
    kv_bytes: int


GPU = Sizes(LLAMA_3_2_1B, 64, 128, 128, 256, 8, 8 << 30)
DRY = Sizes(Shape("llama-tiny", "LlamaForCausalLM", 128, 2, 4, 2, 256, 1024, tied=True), 8, 16, 8, 16, 8, 64 << 20)
LORA_RANK = 16
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def run(check, report) -> None:
    sizes = DRY if check.dry_run else GPU
    cuda = check.device.startswith("cuda")
    if cuda:
        bandwidth = copy_bandwidth()
        report.result("copy bandwidth GB/s", round(bandwidth / 1e9),
                      text=f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s (bytes read + written)")
    hf = make_hf_model(sizes.shape, "bfloat16", check.device, seed=0, max_positions=4096)
    loaded = loaded_weights(hf, sizes.shape, max_positions=4096)
    prompts = random_prompts([sizes.prompt_len] * sizes.batch, sizes.shape.vocab, seed=7)
    for mode, eager, async_scheduling in modes(cuda):
        engine = make_engine(loaded, check.device, "bfloat16", max_model_len=1024, kv_cache_memory_bytes=sizes.kv_bytes,
                             enforce_eager=eager, async_scheduling=async_scheduling, max_num_seqs=max(64, sizes.batch))
        if not eager and async_scheduling:
            report.result("weight bytes", engine.runner.weight_bytes,
                          text=f"weights read per decode step: {engine.runner.weight_bytes / 1e9:.3f} GB")
        rate = single_stream(engine, prompts[0], sizes.single_new_tokens)
        bound = f", {rate / (bandwidth / engine.runner.weight_bytes):.0%} of the HBM bound " \
                f"{bandwidth / engine.runner.weight_bytes:.0f} tok/s" if cuda else ""
        report.result(f"single-stream decode tok/s ({mode})", round(rate, 1),
                      text=f"single-stream decode ({mode}): {rate:.1f} tok/s{bound}")
        rate = batch_rate(engine, prompts, sizes.new_tokens)
        report.result(f"batch-{sizes.batch} tok/s ({mode})", round(rate, 1),
                      text=f"batch {sizes.batch} x {sizes.prompt_len}+{sizes.new_tokens} tokens ({mode}): {rate:.1f} "
                           "generated tok/s, prefill included")
        del engine
        free_memory(check.device)
    rate = hf_generate_rate(hf, prompts, sizes.new_tokens, check.device)
    report.result(f"transformers batch-{sizes.batch} tok/s", round(rate, 1),
                  text=f"transformers generate, same batch: {rate:.1f} generated tok/s")
    adapters = write_adapters(check.work_dir / "adapters", sizes)
    lora_engine = make_engine(loaded, check.device, "bfloat16", max_model_len=1024, kv_cache_memory_bytes=sizes.kv_bytes,
                              max_loras=sizes.num_adapters, max_lora_rank=LORA_RANK, max_num_seqs=max(64, sizes.batch))
    for name, folder in adapters.items():
        lora_engine.lora.manager.register(name, folder)
    names = [list(adapters)[i % len(adapters)] for i in range(sizes.batch)]
    rate = batch_rate(lora_engine, prompts, sizes.new_tokens, names)
    report.result(f"LoRA-mixed batch-{sizes.batch} tok/s", round(rate, 1),
                  text=f"batch {sizes.batch} over {len(adapters)} LoRA adapters (rank {LORA_RANK}, all 7 projections; "
                       f"steps with adapters run eagerly): {rate:.1f} generated tok/s")
    del lora_engine
    free_memory(check.device)
    try:
        peft_rate(check, report, hf, adapters, prompts, names, sizes)
    except Exception as exc:
        report.note(f"transformers + PEFT mixed-adapter batch failed: {type(exc).__name__}: {exc}")


def modes(cuda: bool) -> list[tuple[str, bool, bool]]:
    """(label, enforce_eager, async_scheduling): the engine's CUDA default (graphs, async scheduling) keeps the
    labels of earlier reports; each mode also runs without async scheduling. The dry run covers both loops."""
    if not cuda:
        return [("eager", True, False), ("eager, async scheduling", True, True)]
    return [("CUDA graphs", False, True), ("CUDA graphs, no async scheduling", False, False),
            ("eager", True, True), ("eager, no async scheduling", True, False)]


def free_memory(device: str) -> None:
    """An engine's KV cache and graphs go back to the device before the next one is built."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def copy_bandwidth(num_bytes: int = 1 << 30, repeats: int = 20) -> float:
    """Bytes read plus written per second by a device-to-device copy, the median of `repeats`."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * num_bytes / sorted(times[3:])[repeats // 2]


def _drain(engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def single_stream(engine, prompt: list[int], new_tokens: int) -> float:
    """Decode tok/s of one request, timed from its first token (a warm-up request runs first)."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.add_request("single", prompt, params)
    first = None
    while first is None:
        if any(o.new_token_ids for o in engine.step()):
            first = time.perf_counter()
    _drain(engine)
    return (new_tokens - 1) / (time.perf_counter() - first)


def batch_rate(engine, prompts, new_tokens: int, loras: list[str] | None = None) -> float:
    """Generated tok/s of the whole batch from submission to the last token, after a short warm-up batch."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), loras)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    outputs = engine.generate(prompts, params, loras)
    elapsed = time.perf_counter() - started
    assert all(len(o[0].token_ids) == new_tokens for o in outputs)
    return len(prompts) * new_tokens / elapsed


def hf_generate_rate(hf, prompts, new_tokens: int, device: str) -> float:
    ids = torch.tensor(prompts, device=device)
    settings = dict(do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens, pad_token_id=0)
    with torch.inference_mode():
        hf.generate(ids, **{**settings, "min_new_tokens": 4, "max_new_tokens": 4})
        _sync(device)
        started = time.perf_counter()
        out = hf.generate(ids, **settings)
        _sync(device)
    assert out.shape[1] == ids.shape[1] + new_tokens
    return ids.numel() // ids.shape[1] * new_tokens / (time.perf_counter() - started)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def write_adapters(root: Path, sizes: Sizes) -> dict[str, Path]:
    """PEFT-format adapters with random A and B (seeded), on every projection."""
    from safetensors.torch import save_file

    s = sizes.shape
    head_dim = s.hidden // s.heads
    dims = {"q_proj": (s.hidden, s.hidden), "k_proj": (s.hidden, s.kv_heads * head_dim),
            "v_proj": (s.hidden, s.kv_heads * head_dim), "o_proj": (s.hidden, s.hidden),
            "gate_proj": (s.hidden, s.ffn), "up_proj": (s.hidden, s.ffn), "down_proj": (s.ffn, s.hidden)}
    folders = {}
    for index in range(sizes.num_adapters):
        g = torch.Generator().manual_seed(100 + index)
        tensors = {}
        for layer in range(s.layers):
            for module, (fan_in, fan_out) in dims.items():
                part = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
                key = f"base_model.model.model.layers.{layer}.{part}.{module}"
                tensors[f"{key}.lora_A.weight"] = (torch.randn(LORA_RANK, fan_in, generator=g) / fan_in ** 0.5
                                                   ).to(torch.bfloat16)
                tensors[f"{key}.lora_B.weight"] = (torch.randn(fan_out, LORA_RANK, generator=g) * 0.01
                                                   ).to(torch.bfloat16)
        folder = root / f"adapter{index}"
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, folder / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": 2 * LORA_RANK, "target_modules": list(LORA_MODULES),
             "bias": "none"}))
        folders[f"adapter{index}"] = folder
    return folders


def peft_rate(check, report, hf, adapters, prompts, names, sizes: Sizes) -> None:
    """transformers + PEFT on the same mixed batch (`adapter_names`), where PEFT is installed."""
    try:
        from peft import PeftModel
    except ImportError:
        report.note("transformers + PEFT mixed-adapter batch: peft is not installed, not measured")
        return
    items = list(adapters.items())
    model = PeftModel.from_pretrained(hf, str(items[0][1]), adapter_name=items[0][0])
    for name, folder in items[1:]:
        model.load_adapter(str(folder), adapter_name=name)
    ids = torch.tensor(prompts, device=check.device)
    settings = dict(do_sample=False, min_new_tokens=sizes.new_tokens, max_new_tokens=sizes.new_tokens,
                    pad_token_id=0, adapter_names=names)
    with torch.inference_mode():
        model.generate(input_ids=ids, **{**settings, "min_new_tokens": 4, "max_new_tokens": 4})
        _sync(check.device)
        started = time.perf_counter()
        model.generate(input_ids=ids, **settings)
        _sync(check.device)
    rate = len(prompts) * sizes.new_tokens / (time.perf_counter() - started)
    report.result(f"transformers+PEFT LoRA-mixed batch-{sizes.batch} tok/s", round(rate, 1),
                  text=f"transformers + PEFT generate, same mixed batch: {rate:.1f} generated tok/s")
