"""Builds the host's C span recorder (modelplex.observability._span_recorder) in place with the machine's C compiler,
for a source tree that was not pip-installed (what `pip install` compiles through setuptools)."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

root = Path(sys.argv[1])
source = root / "platform" / "modelplex" / "observability" / "_span_recorder.c"
target = source.with_name("_span_recorder" + sysconfig.get_config_var("EXT_SUFFIX"))
compiler = os.environ.get("CC", "cc")
command = [compiler, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(target)]
print(" ".join(command), flush=True)
sys.exit(subprocess.run(command).returncode)
