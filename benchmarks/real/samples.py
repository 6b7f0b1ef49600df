"""What the student writes: held-out prompts continued by the student, judged by the teacher.

Two figures per model (PROTOCOL.md, amendment 1), computed the same way for every confirmatory arm:

* **teacher bits per byte on the student's samples**: the student continues each held-out prompt
  with ``new_tokens`` sampled tokens (temperature 1, a fixed seed per prompt, stopping at its end
  token); the teacher reads prompt + continuation in its own tokenization and the figure is the
  teacher's bits over the continuation's bytes -- the on-policy objective itself. Teacher tokens
  that start inside the prompt (one may straddle the boundary) are left out, with their bytes;
* **repetition**: the fraction of the continuations' student 4-grams that repeat an earlier
  4-gram of the same continuation (0 = none; a degenerate loop approaches 1).
"""

from __future__ import annotations

import math

import torch

NGRAM = 4


def continuations(model, tok, prompts: list[str], new_tokens: int, seed: int) -> list[list[int]]:
    """The student's sampled token ids after each prompt (generation with the model's cache)."""
    was_training = model.training
    model.eval()
    out = []
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([[int(x) for x in tok.encode(prompt).ids]])
        torch.manual_seed(seed + i)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=new_tokens, eos_token_id=tok.eos_id,
                                 pad_token_id=tok.eos_id if tok.pad_id is None else tok.pad_id)
        new = [int(x) for x in gen[0, ids.shape[1]:]]
        out.append(new[:new.index(tok.eos_id)] if tok.eos_id in new else new)
    model.train(was_training)
    return out


def repetition(conts: list[list[int]], n: int = NGRAM) -> float:
    """Repeated n-grams / all n-grams, over every continuation (module doc)."""
    repeated = total = 0
    for ids in conts:
        seen = set()
        for i in range(len(ids) - n + 1):
            gram = tuple(ids[i:i + n])
            repeated += gram in seen
            seen.add(gram)
            total += 1
    return repeated / total if total else 0.0


def teacher_bits(teacher, ttok, prompt: str, text: str, add_bos: bool) -> tuple[float, int]:
    """(bits, bytes) of ``text`` after ``prompt`` under the teacher (module doc)."""
    enc = ttok.encode(prompt + text)
    ids = [int(x) for x in enc.ids]
    lead = [ttok.bos_id] if add_bos and ttok.bos_id is not None else []
    with torch.no_grad():
        logits = teacher(input_ids=torch.tensor([lead + ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    boundary, bits, first = len(prompt.encode()), 0.0, None
    for i, tid in enumerate(ids):
        start = int(enc.ends[i - 1]) if i else 0
        if start < boundary or (i == 0 and not lead):   # a first token without BOS has no context
            continue
        first = start if first is None else first
        bits -= float(logp[len(lead) + i - 1, tid]) / math.log(2)
    total = int(enc.ends[-1]) if ids else 0
    return bits, (total - first) if first is not None else 0


def sample_figures(model, tok, spec: dict) -> dict:
    """Both figures for ``model`` on ``spec`` = {prompts, new_tokens, seed, teacher, teacher_add_bos}."""
    from xdistill.student.model import load_causal_lm
    from xdistill.tokenization import load_tokenizer

    conts = continuations(model, tok, spec["prompts"], spec["new_tokens"], spec["seed"])
    texts = [b"".join(tok.table.token_bytes(t) for t in c).decode("utf-8", errors="ignore")
             for c in conts]
    teacher, ttok = load_causal_lm(spec["teacher"]).float().eval(), load_tokenizer("gemma3-270m")
    bits = nbytes = 0
    for prompt, text in zip(spec["prompts"], texts):
        b, n = teacher_bits(teacher, ttok, prompt, text, spec.get("teacher_add_bos", True))
        bits, nbytes = bits + b, nbytes + n
    del teacher
    return {"teacher_bpb_on_samples": bits / max(nbytes, 1), "repetition": repetition(conts),
            "sample_bytes": nbytes / max(len(texts), 1), "examples": texts[:3]}
