# The two commands the README promises: `make demo` and `make test`.
# Both work on a fresh Debian/Ubuntu machine with Python >= 3.11: they create
# .venv, install jsfl into it, and make Fashion-MNIST available (Debian's
# dataset-fashion-mnist package when apt is there, else jsfl downloads it).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
FMNIST := /usr/share/datasets/fashion-mnist
PYTEST_ARGS ?=

.PHONY: demo test test-slow lint venv data clean bench

$(BIN)/jsfl: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "jsfl needs Python >= 3.11"'
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed; installing python3-venv"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv && \
	  rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/jsfl

# Fashion-MNIST from Debian's package where apt is available; otherwise the
# first run downloads it into ~/.cache/jsfl (see README, "Data").
data:
	@if [ ! -d $(FMNIST) ] && command -v apt-get >/dev/null; then \
	  ($(SUDO) apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	   { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq dataset-fashion-mnist; }) || \
	  echo "note: dataset-fashion-mnist not installed; jsfl will download Fashion-MNIST"; \
	fi

# The run goes to an exact directory so the report and the plots can follow
# it: the demo ends with the run's table (also in DIR/report.md, .csv) and the
# paths of its PNGs (DIR/plots/).
DEMO_DIR := runs/demo-$(shell date +%Y%m%d-%H%M%S)

demo: venv data
	$(BIN)/jsfl run experiments/core/demo.toml run.dir=$(DEMO_DIR)
	@echo
	$(BIN)/jsfl report $(DEMO_DIR) --out $(DEMO_DIR)
	@echo
	@echo "plots:"
	@$(BIN)/jsfl plot $(DEMO_DIR)

# The layering (import-linter), the style (ruff) and the annotations (mypy)
# are checked before the suite: a layer importing upward fails CI.
lint: venv
	$(BIN)/ruff check jsfl
	$(BIN)/lint-imports
	$(BIN)/mypy

test: venv data lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow" $(PYTEST_ARGS)

test-slow: venv data
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

bench: venv
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) .pytest_cache runs
