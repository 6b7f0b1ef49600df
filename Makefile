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
	$(PIP) install --quiet -e ".[ray,test,plot]"
	$(PYTHON) tools/check_env.py
	touch $(STAMP)

install: $(STAMP)

assets: $(STAMP)
	$(PYTHON) tools/fetch_assets.py

test: assets
	$(PYTHON) -m pytest -m "not slow and not gpu and not multigpu" $(PYTEST_ARGS)

# the demo: (1) real tokenizer pairs compared by bytes vs raw strings; (2) a real off-policy
# distillation run (configs/offpolicy_tiny_cpu.yaml: GPT-2-tokenizer student, a Qwen2-tokenizer
# teacher and a GPT-2-tokenizer teacher, FSDP2-ready loop, eval in bits per byte, HF export)
DEMO_OUT := runs/demo_offpolicy
demo: assets
	$(VENV)/bin/xdistill demo tokenizers
	[ -d runs/tiny_assets/teacher_gpt2 ] || $(PYTHON) tools/make_tiny_models.py --out runs/tiny_assets
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/xdistill train offpolicy --config configs/offpolicy_tiny_cpu.yaml \
		train.out_dir=$(DEMO_OUT) checkpoint.resume=
	$(VENV)/bin/xdistill plot $(DEMO_OUT)/metrics.jsonl -o $(DEMO_OUT)/curves.png
	@echo "demo artifacts: $(DEMO_OUT)/metrics.jsonl, $(DEMO_OUT)/curves.png, $(DEMO_OUT)/checkpoints, $(DEMO_OUT)/export (HF student)"

bench: assets
	for b in benchmarks/*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
