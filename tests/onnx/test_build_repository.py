"""The example repository builder: skips what is built, rebuilds on --force, never leaves half a model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from build_repository import build

BUILDER = Path(__file__).resolve().parents[2] / "examples" / "build_repository.py"


def test_built_models_are_skipped_unless_forced(tmp_path):
    assert build(tmp_path, ["simple"]) == ["simple"]
    model_file = tmp_path / "simple" / "1" / "model.onnx"
    first = model_file.stat().st_mtime_ns
    assert build(tmp_path, ["simple", "simple_string"]) == ["simple_string"]
    assert model_file.stat().st_mtime_ns == first
    assert build(tmp_path, ["simple"], force=True) == ["simple"]
    assert model_file.stat().st_mtime_ns != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["simple", "simple_string"]


def test_leftovers_of_an_interrupted_build_are_replaced(tmp_path):
    leftover = tmp_path / ".simple.building"
    (leftover / "1").mkdir(parents=True)
    (leftover / "1" / "model.onnx").write_bytes(b"truncated")
    assert build(tmp_path, ["simple"]) == ["simple"]
    assert not leftover.exists()
    assert (tmp_path / "simple" / "1" / "model.onnx").stat().st_size > len(b"truncated")


def test_command_line(tmp_path):
    run = subprocess.run([sys.executable, str(BUILDER), str(tmp_path), "--models", "simple_string"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "built: simple_string" in run.stderr
    assert (tmp_path / "simple_string" / "config.pbtxt").read_text().startswith('name: "simple_string"')
    bad = subprocess.run([sys.executable, str(BUILDER), str(tmp_path), "--models", "simple,resnet"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown example model(s) ['resnet']" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["simple_string"]
