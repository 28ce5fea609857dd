"""Model repositories on disk: Triton's `<repo>/<model>/config.pbtxt` + numbered version folders.

Every name a client gives is checked here before it touches the file system, so a model name
can never resolve to a path outside its repository.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import InvalidInput, NotFound

MAX_NAME_BYTES = 255


def check_name(name: str, what: str = "model name") -> str:
    """A plain folder name: no separators, no `..`, no NUL, not hidden, at most 255 bytes."""
    if (not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name
            or name.startswith(".") or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
            or os.path.isabs(name)):
        raise InvalidInput(f"invalid {what} {name!r}: must be a plain folder name of the repository")
    return name


def confined(root: Path, relative: str) -> Path:
    """`root/relative` with symlinks resolved, refusing anything that lands outside `root`."""
    if "\x00" in relative or os.path.isabs(relative):
        raise InvalidInput(f"invalid path {relative!r}")
    base = root.resolve()
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise InvalidInput(f"path {relative!r} is outside the model repository")
    return target


@dataclass(frozen=True)
class ModelLocation:
    name: str
    path: Path

    @property
    def config_path(self) -> Path:
        return self.path / "config.pbtxt"

    def versions(self) -> list[int]:
        """Numbered version folders (Triton ignores anything else, including `0`-prefixed names)."""
        found = []
        for entry in os.scandir(self.path):
            name = entry.name
            if entry.is_dir() and name.isascii() and name.isdigit() and (name == "0" or not name.startswith("0")):
                found.append(int(name))
        return sorted(found)

    def fingerprint(self, version: int | None = None) -> str:
        """A digest of names, sizes and mtimes: changes when the config or a version's files change."""
        root = self.path if version is None else self.path / str(version)
        digest = hashlib.blake2b(digest_size=16)
        paths = [self.config_path] if version is not None else []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            paths.extend(Path(dirpath) / f for f in sorted(filenames))
        for p in paths:
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            digest.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        return digest.hexdigest()


class ModelRepository:
    """One or more repository folders; a model name must be unique across them."""

    def __init__(self, roots: list[Path]):
        self.roots = list(dict.fromkeys(Path(r).resolve() for r in roots))  # one given twice is one

    def scan(self) -> dict[str, ModelLocation]:
        """Every model folder (a name in two repositories is listed once; loading it fails, naming both)."""
        models: dict[str, ModelLocation] = {}
        for root in self.roots:
            if not root.is_dir():
                continue
            for entry in sorted(os.scandir(root), key=lambda e: e.name):
                if entry.is_dir() and not entry.name.startswith("."):
                    models.setdefault(entry.name, ModelLocation(entry.name, Path(entry.path)))
        return models

    def check_exists(self, name: str) -> None:
        check_name(name)
        if not any((root / name).is_dir() for root in self.roots):
            raise NotFound(f"model '{name}' is not in the model repository")

    def locate(self, name: str) -> ModelLocation:
        check_name(name)
        found = [root / name for root in self.roots if (root / name).is_dir()]
        if len(found) > 1:
            raise InvalidInput(f"model '{name}' is in more than one model repository: "
                               + " and ".join(str(path) for path in found))
        if found:
            confined(found[0].parent, name)
            return ModelLocation(name, found[0])
        raise NotFound(f"model '{name}' is not in the model repository")
