"""Start and stop the servers llm_serving.py measures: modelplex (`modelplex serve`) and llama.cpp (the
`llama-server` binary with parallel slots, or llama-cpp-python's `llama_cpp.server`), one at a time."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "smollm2"
EOG_TOKEN_IDS = (0, 2)  # SmolLM2's <|endoftext|> and <|im_end|>: llama.cpp stops on either


@dataclass
class ServerSpec:
    name: str  # row label in the report
    kind: str  # modelplex | llama-server | llama-cpp-python
    precision: str
    command: list[str] = field(default_factory=list)
    ready_path: str = "/v1/models"
    extra_body: dict = field(default_factory=dict)  # what makes it ignore EOS and report usage
    notes: str = ""


def free_port() -> int:
    """A port the kernel just handed out and that nothing listens on (checked by a connect)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is in use")
    return port


def modelplex_repository(out: Path, kv_tokens: int, threads: int, engine_process: bool = True) -> Path:
    """The example `smollm2` model (fp32, Q4_1 GGUF dequantized at load) with a KV cache of `kv_tokens`
    fp32 tokens (30 layers x 2 x 3 KV heads x 64 x 4 bytes = 46,080 B each) and a queue of 256; its engine
    in a process of its own or in a thread of the server's (`engine_process`)."""
    if not (out / MODEL_NAME / "config.pbtxt").exists():
        subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "build_repository.py"), str(out),
                        "--models", MODEL_NAME], check=True)
    config = out / MODEL_NAME / "config.pbtxt"
    text = config.read_text()
    text = re.sub(r'(key: "kv_cache_memory_bytes" value \{ string_value: ")\d+', rf"\g<1>{kv_tokens * 46080}", text)
    text = re.sub(r'(key: "max_queue_size" value \{ string_value: ")\d+', r"\g<1>256", text)
    if "num_threads" not in text:
        text += f'parameters {{ key: "num_threads" value {{ string_value: "{threads}" }} }}\n'
    text = re.sub(r'parameters \{ key: "engine_process" .*\n', "", text)
    text += f'parameters {{ key: "engine_process" value {{ string_value: "{str(engine_process).lower()}" }} }}\n'
    config.write_text(text)
    return out


def modelplex_spec(repo: Path, port: int, engine_mode: str = "process") -> ServerSpec:
    exe = shutil.which("modelplex", path=os.path.dirname(sys.executable)) or "modelplex"
    return ServerSpec(f"modelplex (native engine, {engine_mode})", "modelplex", "fp32 (Q4_1 dequantized)",
                      [exe, "serve", "--model-repository", str(repo), "--http-port", str(port),
                       "--allow-grpc", "false", "--allow-metrics", "false", "--host", "127.0.0.1"],
                      ready_path="/v2/health/ready",
                      extra_body={"ignore_eos": True, "stream_options": {"include_usage": True}})


def llama_server_spec(binary: str, gguf: str, precision: str, port: int, threads: int, slots: int,
                      ctx: int, extra: list[str]) -> ServerSpec:
    cache = ["-ctk", "f32", "-ctv", "f32"] if precision.startswith("F32") else []
    return ServerSpec(f"llama-server {slots} slots ({precision})", "llama-server", precision,
                      [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                       "-tb", str(threads), "-c", str(ctx), "-np", str(slots), "-a", MODEL_NAME, *cache, *extra],
                      ready_path="/health",
                      extra_body={"ignore_eos": True, "stream_options": {"include_usage": True}},
                      notes=f"-c {ctx} -np {slots} {' '.join(cache + extra)}")


def llama_cpp_python_spec(python: str, gguf: str, precision: str, port: int, threads: int,
                          extra: list[str]) -> ServerSpec:
    return ServerSpec(f"llama-cpp-python server ({precision})", "llama-cpp-python", precision,
                      [python, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", MODEL_NAME,
                       "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", str(threads),
                       "--n_threads_batch", str(threads), "--interrupt_requests", "False", *extra],
                      extra_body={"logit_bias": {str(t): -1e9 for t in EOG_TOKEN_IDS}},
                      notes="one request at a time (the server holds a global lock); EOS masked by logit_bias")


class RunningServer:
    """A server subprocess in its own process group, its output in `log_path`."""

    def __init__(self, spec: ServerSpec, port: int, log_path: Path, env: dict | None = None):
        self.spec, self.port, self.log_path = spec, port, log_path
        self.base_url = f"http://127.0.0.1:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(spec.command, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, start_new_session=True)

    def wait_ready(self, timeout=600.0) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.base_url + self.spec.ready_path, timeout=2).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.spec.name} not ready after {timeout} s; see {self.log_path}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._log.close()

    def cpu_seconds(self) -> float:
        """CPU time of the server and its children so far (for the foreign-load estimate)."""
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            total = 0.0
            for p in [root, *root.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
            return total
        except psutil.Error:
            return 0.0
