#!/usr/bin/env bash
# Tiny on-policy distillation on CPU: builds the tiny teachers/corpus once (runs/tiny_assets),
# then trains configs/onpolicy_tiny_cpu.yaml (prompts: configs/prompts_tiny.jsonl). Extra args are overrides,
# e.g.  examples/onpolicy_tiny.sh train.steps=5
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1
[ -d runs/tiny_assets/teacher_qwen2 ] || "$PY" tools/make_tiny_models.py --out runs/tiny_assets
exec "$PY" -m xdistill.cli train onpolicy --config configs/onpolicy_tiny_cpu.yaml "$@"
