# One-command entry points. Both create .venv if missing, install the CPU build of
# torch==2.13.0 first (a bare `torch` requirement would pull the CUDA wheels), then the
# package itself with the `test` extra (every optional dependency, pytest, hypothesis).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pointformers-installed

.PHONY: demo test test-heavy wheel-smoke install clean

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

test: $(STAMP)
	$(BIN)/python -m pytest

# Slow whole-repository checks (every config's model exported and compared with itself).
test-heavy: $(STAMP)
	$(BIN)/python -m pytest -m heavy

# Build the wheel, install it (torch==2.13.0 first) into a fresh venv in a temporary folder and
# use it from outside the source tree: package data, core-only imports, the shipped checkpoint,
# the command (scripts/wheel_smoke.sh; needs no .venv).
wheel-smoke:
	PYTHON=$(PYTHON) bash scripts/wheel_smoke.sh

clean:
	rm -rf $(VENV) .pointformers-cache runs
