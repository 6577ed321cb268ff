# Fresh machine: `make demo` (main job) or `make check` (all tests). Both create .venv when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Keep lit's per-test timeout generous: CI machines are shared and noisy.
LIT_OPTS ?= -sv

.PHONY: setup demo check check-lit check-pytest bench sweep sweep-shard sweep-report models models-shard models-report shapes clean

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

# PYTEST_WORKERS=1 on a host shared with other work.
PYTEST_WORKERS ?= 2
check-pytest: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) test/unit

# lit first, pytest last: the runner's summary line closes the output.
check: setup
	$(MAKE) --no-print-directory check-lit
	$(MAKE) --no-print-directory check-pytest

# PyTorch's op database, every op and dtype, at two precisions (docs/coverage.md). Shard it across machines with
# `make sweep-shard SHARD=i/n` (results in build/opdb/), then `make sweep-report` where the files are gathered.
SHARDS ?= 2
SAMPLES ?= 2
SWEEP_PRECISIONS ?= fp32-reference dlf16
sweep: setup
	mkdir -p build/opdb
	for p in $(SWEEP_PRECISIONS); do for i in $$(seq 0 $$(($(SHARDS) - 1))); do \
	  $(BIN)/python test/opdb/sweep.py --precision $$p --samples $(SAMPLES) --shard $$i/$(SHARDS) \
	    --out build/opdb/$$p-$$i.jsonl & \
	done; wait; done
	$(BIN)/python test/opdb/report.py build/opdb/*.jsonl

sweep-shard: setup
	mkdir -p build/opdb
	for p in $(SWEEP_PRECISIONS); do $(BIN)/python test/opdb/sweep.py --precision $$p --samples $(SAMPLES) \
	  --shard $(SHARD) --out build/opdb/$$p-$$(echo $(SHARD) | tr / -).jsonl || exit 1; done

sweep-report: setup
	$(BIN)/python test/opdb/report.py build/opdb/*.jsonl

# Big and awkward shapes (no whole stick divides a dim, rows longer than the scratchpad) over core counts and
# precisions (test/shapes/sweep.py; a slice runs in `make check`). `SHARD=i/n` runs one shard.
SHARD ?= 0/1
shapes: setup
	$(BIN)/python test/shapes/sweep.py --shard $(SHARD) --out build/shapes/shard-$$(echo $(SHARD) | tr / -).jsonl

# The Hugging Face model matrix (docs/models.md): every family x attention x mask x entry point x precision x
# cores. `make models-shard SHARD=i/n` runs one shard (results in build/models/), `make models-report` renders.
MODEL_SHARDS ?= 2
models: setup
	mkdir -p build/models
	for i in $$(seq 0 $$(($(MODEL_SHARDS) - 1))); do \
	  $(BIN)/python test/models/matrix.py --shard $$i/$(MODEL_SHARDS) --out build/models/shard-$$i.jsonl & \
	done; wait
	$(BIN)/python test/models/report.py build/models/*.jsonl

models-shard: setup
	mkdir -p build/models
	$(BIN)/python test/models/matrix.py --shard $(SHARD) --out build/models/shard-$$(echo $(SHARD) | tr / -).jsonl

models-report: setup
	$(BIN)/python test/models/report.py build/models/*.jsonl

# The peers (IREE, matplotlib) are an optional extra, installed here only.
bench: setup
	$(BIN)/pip install --quiet -e '.[test,peers]'
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf build $(VENV) *.egg-info
