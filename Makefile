# Tandem developer entry points. `make help` lists them.
# The two commands a fresh machine needs are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TANDEM := $(VENV)/bin/tandem
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml lab/pyproject.toml | sha1sum | cut -c1-12)

.PHONY: help setup generate verify lint typecheck test test-fast test-realengine demo demo-down bench clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk 'BEGIN{FS=":.*## "} {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml lab/pyproject.toml
	@echo "==> setting up $(VENV) (Python deps from PyPI)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade "pip>=25.1"
	@$(PY) -m pip install -q -e . -e ./lab --group dev
	@rm -f $(VENV)/.installed-*; touch $@

setup: $(STAMP) ## create the virtualenv and install Tandem (product + lab, editable) with its dev tools (idempotent)

generate: setup ## render crds/ (and the chart's copy) from the API models
	@$(TANDEM) crds
	@mkdir -p charts/tandem/files/crds && rm -f charts/tandem/files/crds/*.yaml && cp crds/*.yaml charts/tandem/files/crds/ && echo "copied to charts/tandem/files/crds/"

verify: generate ## regenerate, then fail if anything differs from what is committed
	@git diff --exit-code -- crds charts || { echo "generated files drifted: commit the output of 'make generate'"; exit 1; }
	@test -z "$$(git status --porcelain -- crds charts)" || { git status --porcelain -- crds charts; echo "untracked generated files"; exit 1; }

lint: setup ## ruff (lint + format check), import-linter contracts, yamllint on examples
	@$(VENV)/bin/ruff check operator lab tests tools
	@$(VENV)/bin/ruff format --check operator lab tests tools
	@$(VENV)/bin/lint-imports
	@$(VENV)/bin/yamllint -s -c .yamllint.yaml examples

typecheck: setup ## mypy --strict with the pydantic plugin
	@$(VENV)/bin/mypy

test: setup ## set up everything (venv, local control plane, Prometheus) and run the whole suite, as CI does
	@tools/run-tests.sh

test-realengine: setup ## install the real-engine environment (vLLM on the CPU, cached) and run the realengine tier
	@tools/realengine/install.sh
	@$(VENV)/bin/pytest -m "realengine and not nightly" -p no:cacheprovider

test-fast: setup ## unit + component tiers only (no cluster)
	@$(VENV)/bin/pytest -m "unit or component" -q

demo: setup ## the local cluster demo: reference fleet, scaling, a promotion and a rollback
	@tools/demo.sh

demo-down: setup ## tear the demo cluster down
	@.venv/bin/tandem demo --down

bench: setup ## fleet, controller and router benchmarks into bench/results/
	@tools/bench.sh

clean: ## remove caches in the tree (the toolchain cache outside the repo is kept)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Local control plane: testenv, cluster-up, cluster-down, cluster-status.
include tools/testenv/testenv.mk
