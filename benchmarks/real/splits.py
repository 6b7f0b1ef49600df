"""The evidence protocol's texts (PROTOCOL.md): domain, student slice, validation, test, and
texts outside them, each prepared once into arrow shards. Two schemes:

``blocks4`` (amendment 4, the default) and ``blocks`` (amendment 2): each of the four domain
plays (``DOMAIN``) is cut into ``BLOCKS`` contiguous blocks of passages, and ``HELD_OUT[scheme]``
names the held-out ones (validation 4 and 14 in both; test 1 and 11 under ``blocks4``, 9 and 19
under ``blocks``, whose test blocks amendment 4 returns to the domain);

* domain: every block but the held-out ones -- the teacher adapts on all of it; the student
  trains on a ``slice_kb`` slice of it (every n-th passage);
* validation: the validation blocks of every play -- every decision;
* test: the test blocks of every play -- the confirmatory table only, scored once;
  validation and test interleave the plays passage by passage, so that the first evaluation
  tokens come from all four;
* other play: *Twelfth Night* -- reported, not tested;

``plays`` (the protocol as first written): the teacher adapts on all four plays; validation is
*The Tempest*, test *Twelfth Night*. Both schemes add the out-of-domain text: Python's own
language reference topics (``pydoc_data.topics``, shipped with CPython, English technical prose)
-- what distillation on Shakespeare costs elsewhere. Its sha256 is recorded, since it follows
the Python patch version.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

DOMAIN = ("hamlet", "macbeth", "othello", "julius_caesar")
VALID, TEST = "tempest", "twelfth_night"
OOD_KB = 96
SCHEMES = ("blocks4", "blocks", "plays")
BLOCKS = 20
HELD_OUT = {"blocks4": ((4, 14), (1, 11)), "blocks": ((4, 14), (9, 19))}  # (validation, test)
SPLITS = {"blocks4": ("domain", "slice", "valid", "test", "other_play", "ood"),
          "blocks": ("domain", "slice", "valid", "test", "other_play", "ood"),
          "plays": ("domain", "slice", "valid", "test", "ood")}


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


def held_out_blocks(docs: list[str], scheme: str = "blocks4"
                    ) -> tuple[list[str], list[str], list[str]]:
    """One play's passages as (train, validation, test): ``BLOCKS`` contiguous blocks of equal
    passage count (the last ones one shorter), the scheme's validation and test blocks
    (``HELD_OUT``) held out, in order."""
    valid, test = HELD_OUT[scheme]
    bounds = [round(i * len(docs) / BLOCKS) for i in range(BLOCKS + 1)]
    block = [docs[bounds[i]:bounds[i + 1]] for i in range(BLOCKS)]
    pick = lambda ids: [d for i in ids for d in block[i]]  # noqa: E731
    held = set(valid) | set(test)
    return pick(i for i in range(BLOCKS) if i not in held), pick(valid), pick(test)


def interleave(groups: list[list[str]]) -> list[str]:
    """Round robin over ``groups`` (the first of each, then the second, ...), longer ones last."""
    return [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]


def texts(slice_kb: int, scheme: str = "blocks4") -> dict[str, list[str]]:
    from xdistill.tiny import passages

    if scheme not in SCHEMES:
        raise ValueError(f"splits: unknown scheme {scheme!r}; expected one of {SCHEMES}")
    if scheme == "plays":
        domain = [p for play in DOMAIN for p in passages(plays=[play])]
        held = {"valid": passages(plays=[VALID]), "test": passages(plays=[TEST])}
    else:
        parts = [held_out_blocks(passages(plays=[play]), scheme) for play in DOMAIN]
        domain = [p for train, _, _ in parts for p in train]
        held = {"valid": interleave([v for _, v, _ in parts]),
                "test": interleave([t for _, _, t in parts]),
                "other_play": passages(plays=[TEST])}
    total = sum(len(p.encode()) for p in domain)
    every = max(1, round(total / (slice_kb * 1024)))
    return {"domain": domain, "slice": domain[::every], **held, "ood": ood_passages()}


def prepare_splits(root: Path, slice_kb: int, scheme: str = "blocks4") -> dict:
    """Arrow folders of every split under ``root/data_<scheme>`` (``data_v2`` for ``plays``;
    reused when present), their sizes in KB, text digests, and the validation/test passages for
    the agreement metric."""
    from xdistill.data.prepare import prepare

    out = {"scheme": scheme}
    base = root / ("data_v2" if scheme == "plays" else f"data_{scheme}")
    for name, docs in texts(slice_kb, scheme).items():
        folder = base / name
        if not (folder / "index.json").exists():
            raw = base / f"{name}.jsonl"
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
