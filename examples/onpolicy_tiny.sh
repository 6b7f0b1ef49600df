#!/usr/bin/env bash
# Tiny on-policy distillation on CPU: builds the tiny teachers/corpus once (runs/tiny_assets),
# writes a prompt file, then trains configs/onpolicy_tiny_cpu.yaml. Extra args are overrides,
# e.g.  examples/onpolicy_tiny.sh train.steps=5
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1
[ -d runs/tiny_assets/teacher_qwen2 ] || "$PY" tools/make_tiny_models.py --out runs/tiny_assets
if [ ! -f runs/tiny_assets/prompts.jsonl ]; then
  "$PY" - <<'PYEOF'
import json
from pathlib import Path
prompts = ["To be, or not to be", "What light through yonder window breaks?", "Now is the winter",
           "Friends, Romans, countrymen", "All the world's a stage", "Once more unto the breach",
           "If music be the food of love", "Shall I compare thee to a summer's day?"]
rows = [{"prompt": p} for p in prompts]
rows += [{"messages": [{"role": "user", "content": f"Continue: {p}"}]} for p in prompts]
Path("runs/tiny_assets/prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
PYEOF
fi
exec "$PY" -m xdistill.cli train onpolicy --config configs/onpolicy_tiny_cpu.yaml "$@"
