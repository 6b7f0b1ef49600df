#!/usr/bin/env bash
# Tiny CPU smoke run of configs/offpolicy_tiny_cpu.yaml (about a minute on 2 cores once the
# tiny assets are built: the config's header has the figures).
# Needs the fetched tokenizers (tools/fetch_assets.py) and the Shakespeare corpus asset.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[ -d runs/tiny_assets/teacher_gpt2 ] || "$PY" tools/make_tiny_models.py --out runs/tiny_assets
if [ "${NPROC:-1}" -gt 1 ]; then
  OMP_NUM_THREADS=1 "$PY" -m torch.distributed.run --nproc_per_node "$NPROC" -m xdistill.cli \
    train offpolicy --config configs/offpolicy_tiny_cpu.yaml "$@"
else
  "$PY" -m xdistill.cli train offpolicy --config configs/offpolicy_tiny_cpu.yaml "$@"
fi
"$PY" -m xdistill.cli plot runs/offpolicy_tiny_cpu/metrics.jsonl -o runs/offpolicy_tiny_cpu/curves.png
echo "exported student: runs/offpolicy_tiny_cpu/export"
