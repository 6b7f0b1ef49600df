#!/usr/bin/env bash
# Tiny CPU smoke run of configs/offpolicy_tiny_cpu.yaml (about a minute on 2 cores once the
# tiny assets are built: the config's header has the figures). Extra args are overrides, e.g.
#   examples/offpolicy_tiny_cpu.sh train.steps=5 train.out_dir=runs/mine
# NPROC=2 runs it on 2 ranks (torchrun) in runs/tiny_2ranks: a 1-process checkpoint cannot
# resume on 2 ranks, so the two runs keep separate folders.
# Needs the fetched tokenizers (tools/fetch_assets.py) and the Shakespeare corpus asset.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[ -d runs/tiny_assets/teacher_gpt2 ] || "$PY" tools/make_tiny_models.py --out runs/tiny_assets
if [ "${NPROC:-1}" -gt 1 ]; then OUT=runs/tiny_2ranks; else OUT=runs/offpolicy_tiny_cpu; fi
for arg in "$@"; do            # an out_dir override (the last one wins, as in the trainer)
  case "$arg" in train.out_dir=*) OUT=${arg#train.out_dir=} ;; esac
done
if [ "${NPROC:-1}" -gt 1 ]; then
  OMP_NUM_THREADS=1 "$PY" -m torch.distributed.run --nproc_per_node "$NPROC" -m xdistill.cli \
    train offpolicy --config configs/offpolicy_tiny_cpu.yaml "train.out_dir=$OUT" "$@"
else
  "$PY" -m xdistill.cli train offpolicy --config configs/offpolicy_tiny_cpu.yaml \
    "train.out_dir=$OUT" "$@"
fi
"$PY" -m xdistill.cli plot "$OUT/metrics.jsonl" -o "$OUT/curves.png"
echo "exported student: $OUT/export"
