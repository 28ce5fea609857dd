"""Helpers of the OpenVINO GenAI LLM tests: repository layouts over one converted folder, transformers
references, and the engine's occupancy."""
from __future__ import annotations

import os
import time
from pathlib import Path

import httpx


def link_model(source: Path, target: Path, config: str, skip: tuple[str, ...] = ()) -> None:
    """`target` as a model whose version 1 links the files of `source`'s (but `skip`), with `config`."""
    (target / "1").mkdir(parents=True)
    for file in (source / "1").iterdir():
        if file.name not in skip:
            os.symlink(file, target / "1" / file.name)
    (target / "config.pbtxt").write_text(config)


def ov_llm_config(**parameters: str) -> str:
    return 'backend: "openvino"\nmodel_transaction_policy { decoupled: true }\n' + "".join(
        f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n' for key, value in parameters.items())


def greedy_reference(hf, messages: list[dict], max_tokens: int) -> str:
    """transformers' greedy answer to chat `messages` (fp32, the chat template of the GGUF)."""
    import torch

    tokenizer, model = hf
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def engine_stats(server, model: str) -> dict:
    (stats,) = httpx.get(f"http://{server.http_url}/v2/models/{model}/engine_stats").json()["instances"]
    return stats


def wait_until_idle(server, model: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = engine_stats(server, model)
        if (stats["num_in_flight"], stats.get("num_running"), stats.get("num_waiting")) == (0, 0, 0):
            return stats
        assert time.monotonic() < deadline, f"{model} never went idle: {stats}"
        time.sleep(0.05)
