"""The plugin's declaration: found through its entry point, and torch stays unimported until a model loads."""
from __future__ import annotations

import subprocess
import sys


def test_declaring_the_backend_does_not_import_torch():
    probe = ("import sys, importlib.metadata as m\n"
             "plugin = next(e for e in m.entry_points(group='modelplex') if e.name == 'pytorch').load()\n"
             "[spec] = plugin.modelplex_backends()\n"
             "print(spec.name, spec.platforms, spec.default_model_filename, spec.merges_batches)\n"
             "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["pytorch", "('pytorch_libtorch',)", "model.pt", "True", "False"]
