"""The wheel carries every package: installed into a fresh venv, `modelplex` runs and finds its backends."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["modelplex", "modelplex_onnx", "modelplex_pytorch", "modelplex_native_gpu", "modelplex_openvino",
            "modelplex_python", "triton_python_backend_utils", "modelplex_multilora",
            "modelplex_ensembles", "modelplex_admin"]


def test_wheel_installs_and_runs(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("modelplex-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True)
    # Dependencies come from the project's venv; the packages themselves only from the wheel
    # (the editable install's finder is not active on PYTHONPATH, and cwd is outside the repo).
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    help_text = subprocess.run([env_dir / "bin" / "modelplex", "serve", "--help"], check=True, env=env,
                               cwd=tmp_path, capture_output=True, text=True).stdout
    assert "--model-repository" in help_text and "--model-control-mode" in help_text
    probe = ("import importlib, importlib.metadata as m, sys\n"
             f"for p in {PACKAGES!r}:\n"
             "    mod = importlib.import_module(p)\n"
             "    assert mod.__file__.startswith(sys.prefix), (p, mod.__file__)\n"
             "import modelplex_native_gpu.kernels.cpu as cpu, os\n"  # the C++ source is built where it runs
             "assert all(os.path.isfile(s) for s in cpu._SOURCES), cpu._SOURCES\n"
             "print(sorted(ep.name for ep in m.entry_points(group='modelplex')))\n")
    out = subprocess.run([py, "-c", probe], check=True, env=env, cwd=tmp_path, capture_output=True, text=True).stdout
    assert "onnx" in out and "pytorch" in out


def test_repo_root_does_not_shadow_stdlib_platform():
    out = subprocess.run([sys.executable, "-c", "import platform; print(platform.system())"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    assert out.strip() == "Linux"
