"""`modelplex serve` (a subprocess, as an operator starts it) with one random-weight LLM on the check's
device: one OpenAI streamed chat and one Triton `generate_stream`, read as server-sent events."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from random_models import Shape, make_hf_model

READY_TIMEOUT_S = 180
MAX_TOKENS = 16


def run(check, report) -> None:
    import httpx

    shape = Shape("llama-small-bytes", "LlamaForCausalLM", 256 if check.dry_run else 1024, 2 if check.dry_run else 8,
                  4, 2, 512 if check.dry_run else 2816, 258)
    repo = build_repository(check.work_dir / "repo", shape, check)
    ports = free_ports(3)
    log_path = check.out_dir / "server.log"
    command = [sys.executable, "-m", "modelplex", "serve", "--model-repository", str(repo), "--http-port",
               str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    env = {**os.environ, "MODELPLEX_PLUGINS": "native_gpu"}
    report.note("running: " + " ".join(command[2:]))
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=check.root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{ports[0]}"
            with httpx.Client(base_url=base, timeout=60) as client:
                started = time.perf_counter()
                wait_ready(client, server, log_path)
                report.result("server ready s", round(time.perf_counter() - started, 1),
                              text=f"server ready in {time.perf_counter() - started:.1f} s (model load included)")
                openai_chat(client, report)
                generate_stream(client, report)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                code = server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                code = server.wait()
    report.result("server exit code", code, ok=code == 0, text=f"server exited with {code} after SIGTERM "
                                                               "(log: server.log)")


def build_repository(root: Path, shape: Shape, check) -> Path:
    """<root>/llm/config.pbtxt and 1/ as an HF folder: config.json, safetensors and a byte-level tokenizer."""
    version = root / "llm" / "1"
    version.mkdir(parents=True, exist_ok=True)
    dtype = "float32" if check.dry_run else "bfloat16"
    model = make_hf_model(shape, dtype, "cpu", seed=0)
    model.save_pretrained(version)
    write_tokenizer(version)
    (root / "llm" / "config.pbtxt").write_text(
        'backend: "native_gpu"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        f'parameters {{ key: "dtype" value {{ string_value: "{dtype}" }} }}\n'
        'parameters { key: "max_model_len" value { string_value: "512" } }\n'
        f'parameters {{ key: "kv_cache_memory_bytes" value {{ string_value: "{256 << 20}" }} }}\n')
    return root


def write_tokenizer(folder: Path) -> None:
    """Byte-level BPE without merges: <s>, </s>, then one token per byte (258 tokens); a plain chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<s>": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate(alphabet)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "chat_template": template}))


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def wait_ready(client, server: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with {server.returncode}: {log_path.read_text()[-1500:]}")
        try:
            if client.get("/v2/models/llm/ready").status_code == 200:
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"not ready after {READY_TIMEOUT_S} s: {log_path.read_text()[-1500:]}")


def sse_events(response) -> list[str]:
    return [line[len("data:"):].strip() for line in response.iter_lines() if line.startswith("data:")]


def openai_chat(client, report) -> None:
    body = {"model": "llm", "messages": [{"role": "user", "content": "Hello, GPU"}], "stream": True,
            "max_tokens": MAX_TOKENS, "temperature": 0, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        status = response.status_code
        events = sse_events(response) if status == 200 else [response.read().decode()[:500]]
    elapsed = time.perf_counter() - started
    chunks = [json.loads(e) for e in events if e != "[DONE]" and status == 200]
    usage = next((c["usage"] for c in chunks if c.get("usage")), {})
    finish = [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")]
    ok = status == 200 and events[-1:] == ["[DONE]"] and usage.get("completion_tokens", 0) > 0 and bool(finish)
    report.result("openai streamed chat", {"status": status, "chunks": len(chunks), "usage": usage, "finish": finish},
                  ok=ok, text=f"OpenAI streamed chat: HTTP {status}, {len(chunks)} chunks, usage {usage}, "
                              f"finish {finish}, {elapsed:.2f} s")


def generate_stream(client, report) -> None:
    body = {"text_input": "Hello, GPU", "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
    started = time.perf_counter()
    with client.stream("POST", "/v2/models/llm/generate_stream", json=body) as response:
        status = response.status_code
        events = sse_events(response) if status == 200 else [response.read().decode()[:500]]
    elapsed = time.perf_counter() - started
    parsed = [json.loads(e) for e in events] if status == 200 else []
    errors = [p for p in parsed if "error" in p]
    ok = status == 200 and bool(parsed) and not errors and all("text_output" in p for p in parsed)
    report.result("triton generate_stream", {"status": status, "events": len(parsed), "errors": errors}, ok=ok,
                  text=f"Triton generate_stream: HTTP {status}, {len(parsed)} events, {len(errors)} errors, "
                       f"{elapsed:.2f} s")
    if not ok:
        report.note("events: " + repr(events[:3]))
