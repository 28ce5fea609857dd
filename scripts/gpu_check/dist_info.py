"""Writes a minimal `modelplex-<version>.dist-info` (METADATA, entry_points.txt) into a folder on PYTHONPATH:
the host finds its plugins through the `modelplex` entry-point group, which needs installed metadata, and
on the GPU machine the source tree is used as it is (no pip install)."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def write(root: Path, site: Path) -> Path:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = {**project.get("entry-points", {}), "console_scripts": project.get("scripts", {})}
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items()) + "\n"
        for group, entries in groups.items()))
    return info


if __name__ == "__main__":
    print(write(Path(__file__).resolve().parents[2], Path(sys.argv[1])))
