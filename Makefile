# Fresh machine: `make demo` (main job) or `make check` (all tests). Both create .venv when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Keep lit's per-test timeout generous: CI machines are shared and noisy.
LIT_OPTS ?= -sv

.PHONY: setup demo check check-lit check-pytest bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned, so no dependency can pull a different (CUDA) build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/python examples/demo.py

check-lit: setup
	$(BIN)/lit $(LIT_OPTS) test

check-pytest: setup
	$(BIN)/python -m pytest test/unit

# lit first, pytest last: the runner's summary line closes the output.
check: setup
	$(MAKE) --no-print-directory check-lit
	$(MAKE) --no-print-directory check-pytest

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf build $(VENV) *.egg-info
