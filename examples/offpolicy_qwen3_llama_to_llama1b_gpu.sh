#!/usr/bin/env bash
# 8-GPU recipe of configs/offpolicy_qwen3_llama_to_llama1b_gpu.yaml (UNTESTED: no GPU here).
# Edit the model/data paths in the config first. Builds the Llama-3 -> Qwen3 projection once.
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=${NPROC:-8}
[ -f projections/llama3_to_qwen3.npz ] || xdistill projection build \
  --student /models/Llama-3.2-1B --teacher /models/Qwen3-4B -o projections/llama3_to_qwen3.npz
torchrun --nproc_per_node "$NPROC" -m xdistill.cli train offpolicy \
  --config configs/offpolicy_qwen3_llama_to_llama1b_gpu.yaml "$@"
