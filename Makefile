# xdistill: `make test` and `make demo` set everything up themselves on a fresh machine
# (Python 3.11 + pip): create .venv, install (CPU torch only), fetch the test assets, run.

PY      ?= python3
VENV    := .venv
PYTHON  := $(VENV)/bin/python
PIP     := $(PYTHON) -m pip
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: test demo install assets bench clean help

help:
	@echo "make test   - set up .venv, fetch assets, run the CPU test suite"
	@echo "make demo   - set up .venv, fetch assets, run the demo"
	@echo "make bench  - run the benchmarks (prints figures; see benchmarks/RESULTS.md)"

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch first and pinned: pip takes the local 2.13.0+cpu wheel, never a CUDA build
	$(PIP) install --quiet "torch>=2.6,<2.14"
	$(PIP) install --quiet -e ".[ray,test,plot,tracking]"
	$(PYTHON) tools/check_env.py
	touch $(STAMP)

install: $(STAMP)

assets: $(STAMP)
	$(PYTHON) tools/fetch_assets.py

test: assets
	$(PYTHON) -m pytest -m "not slow and not gpu and not multigpu" $(PYTEST_ARGS)

# the demo: (1) real tokenizer pairs compared by bytes vs raw strings; (2) the shortened quality
# harness (xdistill/quality): a digit-splitting teacher (trained here by `xdistill train
# offpolicy`, cached under the asset folder) distilled into a student with another tokenizer;
# CE-only vs P-KL (+ continuation) vs ALM on held-out accuracy and bits per byte, each arm a real
# trainer run on one thread, two at a time, with a progress line every 10 s. A run that fails or
# stalls (no output for 600 s; `xdistill demo distill --stall-s N`) ends it with one error
# naming the log to read.
DEMO_OUT := runs/demo_distill
demo: assets
	$(VENV)/bin/xdistill demo tokenizers
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/xdistill demo distill --out $(DEMO_OUT)

bench: assets
	for b in benchmarks/*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
