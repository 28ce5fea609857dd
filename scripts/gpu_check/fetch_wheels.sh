#!/usr/bin/env bash
# Download the wheels `modelplex serve` needs on the GPU machine (wheels.txt) into .whl/ at the repo root:
# binary wheels only, for CPython $PYTHON_VERSION on manylinux x86-64 (default 3.12, the GPU image's).
# .whl/ is git-ignored through .git/info/exclude; it travels to the device as a carried path.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DEST="${1:-$ROOT/.whl}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
EXCLUDE="$(git -C "$ROOT" rev-parse --git-path info/exclude)"
grep -qxF "/.whl/" "$EXCLUDE" 2>/dev/null || echo "/.whl/" >> "$EXCLUDE"
mkdir -p "$DEST"
grep -v '^\s*#' "$(dirname "$0")/wheels.txt" | grep -v '^\s*$' | \
    xargs python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        --platform any -d "$DEST"
du -sh "$DEST"
