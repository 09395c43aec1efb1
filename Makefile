# One-command entry points. Both create .venv if missing, install the CPU build of
# torch==2.13.0 first (a bare `torch` requirement would pull the CUDA wheels), then the
# package itself with the `test` extra (every optional dependency, pytest, hypothesis).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pointformers-installed

.PHONY: demo test test-heavy test-faults test-release wheel-smoke examples api-docs install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pointformers demo

# Two worker processes (pytest-xdist), one test file per worker at a time (module fixtures are
# built once); each worker runs torch on one thread (tests/conftest.py).
XDIST := -n 2 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST)

# Slow whole-program checks: several processes per test (seeds, torchrun, the demo end to end),
# every optimiser/schedule killed and resumed, file exports of every mechanism.
test-heavy: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m heavy

# Release check, not in .ci/run (marker `release`): every config's model (full size) exported to
# torch.export and ONNX and both files compared with the model; every registered model exported by a
# user's torch.export; a user's module with each mechanism exported to ONNX; every mechanism compiled
# (aot_eager, dynamic shapes) and compared with eager; the other slowest whole-program checks. About
# twenty minutes on a fast 2-core machine, hours on a slow shared VM (where CI could not finish them).
test-release: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m release

# Fault injection (tests/test_fault_injection.py, docs/reliability.md): kills, full disk, read-only
# and concurrent run folders, damaged files of every format, hostile tensors. Two worker processes
# sharing out single tests as each becomes free (most start a killed or faulty run as a process of its
# own), one thread each.
test-faults: $(STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist worksteal -m faults

# Build the wheel, install it (torch==2.13.0 first) into a fresh venv in a temporary folder and
# use it from outside the source tree: package data, core-only imports, the shipped checkpoint,
# the command (scripts/wheel_smoke.sh; needs no .venv).
wheel-smoke:
	PYTHON=$(PYTHON) bash scripts/wheel_smoke.sh

# Every example script (examples/*.py and examples/export_onnx_cpp/export_and_run.py), two at a
# time, one CPU thread each, each one's output and time printed when it ends; any non-zero exit
# fails the target (scripts/run_examples.sh; JOBS=1 runs them one after the other).
# The longest (the shape classifier's training) starts first.
LONGEST_EXAMPLE := examples/train_shape_classifier.py
EXAMPLES := $(LONGEST_EXAMPLE) $(filter-out $(LONGEST_EXAMPLE),$(sort $(wildcard examples/*.py))) \
	examples/export_onnx_cpp/export_and_run.py

examples: $(STAMP)
	bash scripts/run_examples.sh $(BIN)/python $(EXAMPLES)

# The HTML API reference from the docstrings (pdoc, the `docs` extra) in build/api/; fails on any
# pdoc warning (a module that does not import, a docstring or annotation it cannot process).
api-docs: $(STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python scripts/api_docs.py build/api

clean:
	rm -rf $(VENV) .pointformers-cache runs build/api
