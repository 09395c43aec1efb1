# One-command entry points. Both create .venv if missing, install the CPU build of
# torch==2.13.0 first (a bare `torch` requirement would pull the CUDA wheels), then the
# package itself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pointformers-installed

.PHONY: demo test test-heavy install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test,export]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pointformers demo

test: $(STAMP)
	$(BIN)/python -m pytest

# Slow whole-repository checks (every config's model exported and compared with itself).
test-heavy: $(STAMP)
	$(BIN)/python -m pytest -m heavy

clean:
	rm -rf $(VENV) .pointformers-cache runs
