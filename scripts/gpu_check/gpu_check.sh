#!/usr/bin/env bash
# The GPU check (issue 27), one command on a bare CUDA machine: runs the source tree as it is (PYTHONPATH,
# generated entry-point metadata, the span recorder built here if missing) and writes gpu_report.md/.json
# to $OUT (default /tmp/gpu_check_out). Without CUDA the same script runs as a CPU dry run.
# Wheels the server section needs: scripts/gpu_check/fetch_wheels.sh, installed to a --target folder on PYTHONPATH.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-${TMPDIR:-/tmp}/gpu_check_out}"
SITE="$(mktemp -d)"
export PYTHONPATH="$ROOT/platform:$ROOT/backends/native_gpu:$ROOT/multilora:$ROOT/admin:$ROOT/ensembles:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET  # the kernels compile for the GPU; the dry run sets it where it is needed
"$PY" "$ROOT/scripts/gpu_check/dist_info.py" "$SITE" >/dev/null
if ! "$PY" -c "import modelplex.observability._span_recorder" 2>/dev/null; then  # the host's compiled span recorder
    "$PY" "$ROOT/scripts/gpu_check/build_span_recorder.py" "$ROOT" || echo "span recorder: build failed; the server section will say why"
fi
"$PY" "$ROOT/scripts/gpu_check/run.py" --out "$OUT_DIR" "$@"
