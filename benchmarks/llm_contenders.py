"""The engines llm_offline.py races on one workload: ours and HF in-process, peers as runner subprocesses.

Every contender has `name`, `precision` and `run(items) -> dict` (generated_tokens, wall_s, tok_s,
cpu_ms_per_token, foreign_cores), so rounds can interleave them. A peer that cannot start here is
reported with the reason instead of a figure.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import llm_workloads as W

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(fn, items) -> dict:
    with W.CpuLoad() as load:
        t0, cpu0 = time.perf_counter(), time.process_time()
        generated = fn(items)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"generated_tokens": generated, "wall_s": wall, "tok_s": generated / wall,
            "cpu_ms_per_token": 1e3 * cpu / generated, "foreign_cores": load.foreign_cores}


class HFStatic:
    """transformers `generate` in static batches with left padding: the naive baseline (fp32)."""

    precision = "float32"

    def __init__(self, model_path: str, batch_size: int):
        import torch
        from transformers import AutoModelForCausalLM

        if os.path.isdir(model_path):  # an HF folder (the peers' dense weights)
            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        else:
            folder, name = os.path.split(model_path)
            self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
        self.batch_size = batch_size
        self.name = f"HF transformers generate (static batches of {batch_size})"

    def _generate(self, items) -> int:
        import torch

        generated = 0
        with torch.inference_mode():
            for start in range(0, len(items), self.batch_size):
                batch = items[start:start + self.batch_size]
                width = max(len(x.prompt_ids) for x in batch)
                ids = torch.tensor([[2] * (width - len(x.prompt_ids)) + x.prompt_ids for x in batch])
                mask = torch.tensor([[0] * (width - len(x.prompt_ids)) + [1] * len(x.prompt_ids) for x in batch])
                new = max(x.max_tokens for x in batch)  # a static batch runs to its longest request
                self.model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                    do_sample=False, pad_token_id=2)
                generated += sum(x.max_tokens for x in batch)  # only each request's own tokens count
        return generated

    def run(self, items) -> dict:
        return timed(self._generate, items)


class PeerProcess:
    """A runner from benchmarks/llm_peers/ started once in the peer's venv; each run() times one workload."""

    def __init__(self, name: str, precision: str, python: str, script: str, model: str, items, threads: int,
                 extra_args=(), env=None, start_timeout=1800, run_timeout=3600):
        self.name, self.precision = name, precision
        self.run_timeout = run_timeout
        self.info: dict = {}
        self.error: str | None = None
        self._workload = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump({"requests": [{"prompt_ids": x.prompt_ids, "max_tokens": x.max_tokens} for x in items]},
                  self._workload)
        self._workload.close()
        self._items_len = len(items)
        self.proc = None
        for path in (python, model):
            if not os.path.exists(path):
                self.error = f"not installed here: {path} is missing"
                return
        cmd = [python, os.path.join(HERE, "llm_peers", script), "--workload", self._workload.name, "--model", model,
               "--dtype", precision, "--threads", str(threads), *extra_args]
        self._log = open(os.path.join(tempfile.gettempdir(), f"llm_peer_{script}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env={**os.environ, **(env or {})})
        line = self._read_line(start_timeout)
        if line is None:
            self.error = f"did not start (see {self._log.name}): {self._tail()}"
            self.close()
        else:
            self.info = json.loads(line)
            self.precision = self.info.get("precision", precision)  # what the peer reports it computes in

    def _read_line(self, timeout: float) -> str | None:
        import select

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 5)[0]:
                line = self.proc.stdout.readline()
                if not line:
                    return None  # the runner exited
                if line.startswith("{"):
                    return line
            elif self.proc.poll() is not None:
                return None
        return None

    def _tail(self) -> str:
        self._log.flush()
        with open(self._log.name, errors="replace") as f:
            lines = [x.strip() for x in f.read().splitlines() if x.strip()]
        return " | ".join(lines[-3:])[-600:]

    def run(self, items) -> dict:
        if self.error:
            return {"error": self.error}
        assert len(items) == self._items_len, "a runner serves the workload it was started with"
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        line = self._read_line(self.run_timeout)
        if line is None:
            self.error = f"failed or took over {self.run_timeout:.0f} s in a run: {self._tail()}"
            self.proc.kill()
            return {"error": self.error}
        return json.loads(line)

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if os.path.exists(self._workload.name):
            os.unlink(self._workload.name)


def make_peers(items, args, wanted: set[str], dtype: str) -> list[PeerProcess]:
    """The peers in /work/shared/bench/peers/README.md, from the venvs under args.peers_dir (OpenVINO GenAI
    from ours). vLLM and OpenVINO GenAI compute at `dtype` (our engine's); llama.cpp and onnxruntime-genai run
    their fp32 model builds whatever `dtype` is."""
    d, threads, timeout = args.peers_dir, args.threads, args.peer_run_timeout
    hf_dir = os.path.join(d, "smollm2-hf")
    specs = {
        "vllm": lambda: PeerProcess("vLLM CPU (in-process)", dtype, f"{d}/venv-vllm/bin/python", "vllm_cpu.py",
                                    hf_dir, items, threads,
                                    env={"LD_PRELOAD": f"{d}/venv-vllm/lib/libiomp5.so"}, start_timeout=timeout, run_timeout=timeout),
        "llamacpp": lambda: PeerProcess("llama.cpp (F32 GGUF)", "float32", f"{d}/venv-llamacpp/bin/python",
                                        "llamacpp.py", f"{d}/models/smollm2-135m-f32.gguf", items, threads,
                                        env={"LLAMA_CPP_LIB_PATH": f"{d}/llama-server-build/bin"}, start_timeout=timeout, run_timeout=timeout),
        "ort": lambda: PeerProcess("onnxruntime-genai (static batches of 32)", "float32", f"{d}/venv-ort/bin/python",
                                   "ort_genai.py", f"{d}/smollm2-ort-fp32", items, threads, start_timeout=timeout, run_timeout=timeout),
        # our own venv's openvino-genai, on the IR `make repo` converts into the example repository
        "ov": lambda: PeerProcess("OpenVINO GenAI (continuous batching)", dtype, sys.executable, "ov_genai.py",
                                  os.path.join(os.path.dirname(HERE), "examples", "model_repository", "smollm2_ov", "1"),
                                  items, threads, start_timeout=timeout, run_timeout=timeout),
    }
    return [specs[name]() for name in specs if name in wanted]
