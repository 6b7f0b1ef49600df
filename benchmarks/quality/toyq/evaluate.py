"""Greedy exact-match accuracy on held-out problems, for any exported model + tokenizer.

Legend: B prompts in a group (same token length), T tokens, V vocabulary.

A prompt ``Q: a+b=? A:`` is encoded with the model's own tokenizer; the model decodes greedily
(argmax, no sampling) for up to ``max_new`` tokens or until the decoded text contains ``.``; the
answer is the text before the first ``.``, stripped, and counts when it equals ``str(a + b)``.
An answer is *well formed* when the decoded text has a ``.`` and the stripped text before it is a
non-empty run of digits (the format rate: a collapsed student that never ends its answers, or
writes text instead of a number, has a low one whatever its accuracy).
Prompts are grouped by token length so a group is one dense batch (no padding, no masks).
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch

from toyq.task import prompt

# held by whoever loads and scores a model in the harness process: loading HF models and DCP
# checkpoints from several threads at once is not safe (a checkpoint load in one thread, while
# another thread loaded a model, found meta-device tensors and asked for a process group)
SCORING = threading.Lock()


@torch.no_grad()
def greedy_accuracy(model, tok, pairs, *, max_new: int = 5, batch: int = 256) -> dict:
    """{"accuracy", "format_rate", "n", "examples": first few (prompt, answer, gold)} over
    ``pairs``."""
    model.eval()
    groups: dict[int, list[tuple[list[int], int, int]]] = defaultdict(list)
    for a, b in pairs:
        ids = [int(i) for i in tok.encode(prompt(a, b), add_special_tokens=False).ids]
        groups[len(ids)].append((ids, int(a), int(b)))
    correct, n, formed, examples = 0, 0, 0, []
    for items in groups.values():
        for i in range(0, len(items), batch):
            part = items[i:i + batch]
            ids_BT = torch.tensor([p[0] for p in part], dtype=torch.long)
            for (answer, ok), (_, a, b) in zip(_decode(model, tok, ids_BT, max_new), part):
                gold = str(a + b)
                correct += int(answer == gold)
                formed += int(ok)
                n += 1
                if len(examples) < 5:
                    examples.append([prompt(a, b), answer, gold])
    return {"accuracy": correct / max(n, 1), "format_rate": formed / max(n, 1), "n": n,
            "examples": examples}


def well_formed(text: str) -> bool:
    """The decoded text ends an answer (``.``) and the answer is a non-empty digit run."""
    head, dot, _ = text.partition(".")
    return bool(dot) and head.strip().isdigit()


def _decode(model, tok, ids_BT: torch.Tensor, max_new: int) -> list[tuple[str, bool]]:
    start = ids_BT.shape[1]
    for _ in range(max_new):
        logits_BTV = model(input_ids=ids_BT).logits
        nxt_B = logits_BTV[:, -1].argmax(-1)
        ids_BT = torch.cat([ids_BT, nxt_B[:, None]], 1)
    texts = [tok.decode([int(t) for t in row[start:]]) for row in ids_BT]
    return [(t.split(".")[0].strip(), well_formed(t)) for t in texts]


@torch.no_grad()
def bits_per_byte(model, tok, texts, *, max_len: int = 256) -> float:
    """Held-out bits per byte: summed next-token NLL (nats) of each text's first ``max_len``
    tokens / ln 2 / the UTF-8 bytes those tokens cover (the first token has no prediction, so its
    bytes are not counted). Comparable across tokenizers, as the trainer's ``eval/bpb``."""
    import math

    model.eval()
    nats, nbytes = 0.0, 0
    for text in texts:
        enc = tok.encode(text, add_special_tokens=False)
        ids = [int(i) for i in enc.ids[:max_len]]
        if len(ids) < 2:
            continue
        logp_TV = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        nats -= float(logp_TV[:-1].gather(1, torch.tensor(ids[1:])[:, None]).sum())
        nbytes += int(enc.ends[len(ids) - 1]) - int(enc.ends[0])
    return nats / math.log(2) / max(nbytes, 1)


def load_model(folder: str):
    """The HF model in ``folder``. Switches transformers' progress bars off for this process (a
    "Loading weights" bar per scored checkpoint would flood the harness log); switched off for
    good rather than restored, since scoring threads of the harness load models concurrently."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
