# gpushare: `make demo` and `make test` are the whole set-up (see README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TYPECHECK_ROOT := build/typecheck

.PHONY: demo test lint typecheck unit bench bench-trace bench-log generate check-generated clean venv chaos deploy-check

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpushare demo

test: $(STAMP) lint
	$(BIN)/python -m pytest -n 2 tests

lint: $(STAMP) typecheck
	$(BIN)/ruff check services tests benchmarks tools
	$(BIN)/ruff format --check services tests benchmarks tools
	$(BIN)/lint-imports

# mypy cannot follow setuptools' package-dir mapping, so it reads the package through a symlink.
typecheck: $(STAMP)
	mkdir -p $(TYPECHECK_ROOT) && ln -sfn ../../services $(TYPECHECK_ROOT)/gpushare
	MYPYPATH=$(TYPECHECK_ROOT) $(BIN)/mypy -p gpushare

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

# Renders every deploy/ overlay with kubectl kustomize and validates it (tests/deploy).
deploy-check: $(STAMP)
	$(BIN)/python -m pytest -p no:xdist -q tests/deploy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

bench-trace: $(STAMP)
	$(BIN)/gpushare bench trace --policy all --seeds 42-51

bench-log: $(STAMP)
	$(BIN)/python -m benchmarks.log_replay

chaos: $(STAMP)
	$(BIN)/python -m tools.chaos --duration 60

generate: $(STAMP)
	$(BIN)/python -m tools.generate

check-generated: $(STAMP)
	$(BIN)/python -m tools.generate --check

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
