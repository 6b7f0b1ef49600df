"""The evidence protocol's texts (PROTOCOL.md): domain, student slice, validation, test, and an
out-of-domain text, each prepared once into arrow shards.

* domain: four plays (``DOMAIN``) -- the teacher adapts on all of it; the student trains on a
  ``slice_kb`` slice (every n-th passage);
* validation: *The Tempest* -- every decision (learning rates, smoothing, adaptation length);
* test: *Twelfth Night* -- the confirmatory table only, scored once;
* out-of-domain: Python's own language reference topics (``pydoc_data.topics``, shipped with
  CPython, English technical prose) -- what distillation on Shakespeare costs elsewhere. Its
  sha256 is recorded, since it follows the Python patch version.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

DOMAIN = ("hamlet", "macbeth", "othello", "julius_caesar")
VALID, TEST = "tempest", "twelfth_night"
OOD_KB = 96
SPLITS = ("domain", "slice", "valid", "test", "ood")


def ood_passages(max_chars: int = 600, limit_kb: int = OOD_KB) -> list[str]:
    """The first ``limit_kb`` KB of the Python reference topics, in passages of paragraphs."""
    from pydoc_data.topics import topics

    from xdistill.tiny import group_paragraphs

    paras = (para for key in sorted(topics) for para in topics[key].split("\n\n"))
    out, total = [], 0
    for passage in group_paragraphs(paras, max_chars):
        out.append(passage)
        total += len(passage.encode())
        if total >= limit_kb * 1024:
            break
    return out


def texts(slice_kb: int) -> dict[str, list[str]]:
    from xdistill.tiny import passages

    domain = [p for play in DOMAIN for p in passages(plays=[play])]
    total = sum(len(p.encode()) for p in domain)
    every = max(1, round(total / (slice_kb * 1024)))
    return {"domain": domain, "slice": domain[::every], "valid": passages(plays=[VALID]),
            "test": passages(plays=[TEST]), "ood": ood_passages()}


def prepare_splits(root: Path, slice_kb: int) -> dict:
    """Arrow folders of every split under ``root/data_v2`` (reused when present), their sizes in
    KB, text digests, and the validation/test passages for the agreement metric."""
    from xdistill.data.prepare import prepare

    out = {}
    for name, docs in texts(slice_kb).items():
        folder = root / "data_v2" / name
        if not (folder / "index.json").exists():
            raw = root / "data_v2" / f"{name}.jsonl"
            raw.parent.mkdir(parents=True, exist_ok=True)
            raw.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs),
                           encoding="utf-8")
            prepare([raw], folder, progress=False)
        out[name] = str(folder)
        out[f"{name}_kb"] = sum(len(d.encode()) for d in docs) / 1024
        out[f"{name}_sha256"] = hashlib.sha256("\n".join(docs).encode()).hexdigest()[:16]
        if name in ("valid", "test", "slice"):   # agreement passages; on-policy prompts
            out[f"{name}_texts"] = docs
    return out
