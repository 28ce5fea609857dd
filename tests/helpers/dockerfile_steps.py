"""The Dockerfile read as Docker reads it: instructions with continuations joined and comments dropped,
grouped into stages. Shared by the static checks (test_dockerfile.py) and the build emulation
(test_image_build.py), so both look at the same steps."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
Instruction = tuple[str, str]  # (INSTRUCTION, its arguments)


def instructions(path: Path = ROOT / "Dockerfile") -> list[Instruction]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    text = path.read_text().replace("\\\n", " ")
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def stages(path: Path = ROOT / "Dockerfile") -> list[list[Instruction]]:
    """One list per FROM, starting with that FROM."""
    found: list[list[Instruction]] = []
    for instruction in instructions(path):
        if instruction[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def last(stage: list[Instruction], word: str) -> str:
    return [rest for w, rest in stage if w == word][-1]
