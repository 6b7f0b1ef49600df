"""Held-out evaluation: student loss, bits per byte, per-teacher divergence, alignment coverage.

Legend: B batch, Ts student tokens, Vs student vocabulary.

Over ``eval.batches`` batches per data shard of the held-out paths (the same batches at every
evaluation: a fresh loader each time), summed over all ranks:

* ``eval/loss``: mean student next-token NLL (nats) over predicted tokens (labels >= 0, i >= 1);
* ``eval/bpb``: bits per byte = ``sum NLL / (ln 2 * sum bytes)``, where ``bytes`` is the number of
  UTF-8 bytes of the text the predicted tokens stand for (``TokenByteTable.lengths_V`` minus the
  token's phantom bytes, ``DistillBatch.phantom_BTs``: a SentencePiece dummy-prefix space is not
  text; special tokens count 0 bytes but their NLL counts); null when no byte was scored. Unlike
  per-token loss this is comparable across tokenizers;
* ``eval/<teacher>/loss``: the teacher's loss term (no grad), normalised by its global unit count;
  ``eval/<teacher>/coverage``: fraction of student loss tokens its loss covers (mean over batches);
* ``eval/distill_loss``: the weighted total of the distillation loss.

The batches' loss reports are recorded as typed step metrics (:func:`xdistill.train.step.record_report`,
in float64) and reduced over batches and ranks in one collective; :func:`eval_figures` turns them
into the flat keys.
"""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import islice

import torch

from xdistill.data import DataConfig, build_loader
from xdistill.errors import ConfigError, DataError
from xdistill.losses.engine import shift_targets, token_logprobs
from xdistill.losses.multi_teacher import LossReport
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.train.metrics import (CE, TOTAL, Metric, ReducedMetrics, StepMetrics, Timers,
                                    teacher_coverage, teacher_loss)
from xdistill.train.step import global_counts, micro_step, record_report


@torch.no_grad()
def nll_and_bytes(logits_BTsVs, labels_BTs, lengths_V: torch.Tensor,
                  phantom_BTs: torch.Tensor | None = None) -> tuple[float, int, int]:
    """(sum of NLL in nats, predicted tokens, the UTF-8 bytes of the text they stand for) of one
    batch: each target's table bytes minus its phantom bytes (``DistillBatch.phantom_BTs``: a
    SentencePiece dummy-prefix space is in ``▁Hello``'s table bytes, not in the text)."""
    target_BTs = shift_targets(labels_BTs.clamp_min(0), labels_BTs >= 0)
    logp_BTs = token_logprobs(logits_BTsVs, target_BTs)
    valid = target_BTs >= 0
    nll = float(-(logp_BTs[valid]).double().sum())
    bytes_BTs = lengths_V[target_BTs.clamp_min(0)]
    if phantom_BTs is not None:       # the phantom bytes of the token each output predicts
        bytes_BTs[:, :-1] -= phantom_BTs[:, 1:].to(bytes_BTs.device)
    n_bytes = int(bytes_BTs[valid].sum())
    return nll, int(valid.sum()), n_bytes


def evaluate(model, loss_fn, pool, loaders, plan, cfg, device) -> dict:
    """Run the evaluation (collective: every rank calls it) and return ``eval/*`` metrics."""
    was_training = model.training
    model.eval()
    lengths_V = torch.as_tensor(plan.student_tok.table.lengths_V, dtype=torch.int64)
    batches = [b for loader in loaders for b in islice(iter(loader), cfg.eval.batches)]
    ce = cfg.loss.ce_weight > 0 or loss_fn is None
    num_valid = global_counts(loss_fn, batches, ce)
    metrics = StepMetrics()
    timers = Timers()
    for batch in batches:
        report = micro_step(model, loss_fn, pool, batch, num_valid, timers, device=device,
                            ce_weight=cfg.loss.ce_weight, backward=False,
                            label_smoothing=cfg.loss.label_smoothing,
                            hook=lambda logits, b: _accumulate(metrics, logits, b, lengths_V))
        record_report(metrics, _in_float64(report))
    model.train(was_training)
    return eval_figures(metrics.reduce(), loss_fn is not None, cfg.loss.ce_weight)


NLL, TOKENS, BYTES = Metric("nll"), Metric("tokens"), Metric("bytes")


def _in_float64(report: LossReport) -> LossReport:
    """The report's tensors in float64: the batches' terms are summed in double precision."""
    def f64(x):
        return None if x is None else x.double()

    teachers = {name: replace(t, loss=t.loss.double(), score=f64(t.score))
                for name, t in report.teachers.items()}
    return LossReport(report.total.double(), f64(report.ce), teachers)


def eval_figures(reduced: ReducedMetrics, distill: bool, ce_weight: float) -> dict:
    """The evaluation's figures (module doc) from its typed metrics, reduced over all batches
    and ranks: the flat ``eval/*`` keys, in the order they are written."""
    nll, tokens, n_bytes = (reduced.get(m, 0.0) for m in (NLL, TOKENS, BYTES))
    # bits per byte over no byte is undefined (written as null), not the NLL in bits
    bpb = nll / (math.log(2) * n_bytes) if n_bytes > 0 else math.nan
    out = {"eval/loss": nll / max(tokens, 1), "eval/bpb": bpb,
           "eval/tokens": int(tokens), "eval/bytes": int(n_bytes)}
    terms = {}
    for name, loss in reduced.teacher_losses().items():
        terms["eval/" + teacher_loss(name).key] = loss  # shares of the global mean: summed
        cov = teacher_coverage(name)
        terms["eval/" + cov.key] = reduced.get(cov)      # averaged over batches
    out.update(sorted(terms.items()))
    if distill:
        out["eval/distill_loss"] = reduced.get(TOTAL, 0.0) - ce_weight * reduced.get(CE, 0.0)
    return out


def _accumulate(metrics: StepMetrics, logits_BTsVs, batch, lengths_V) -> None:
    nll, tokens, n_bytes = nll_and_bytes(logits_BTsVs, batch.labels_BTs,
                                         lengths_V.to(logits_BTsVs.device), batch.phantom_BTs)
    metrics.add(NLL, nll)
    metrics.add(TOKENS, tokens)
    metrics.add(BYTES, n_bytes)


def model_bits_per_byte(model, tok, paths, *, seq_len: int = 256, batch_size: int = 4,
                        batches: int = 8, add_bos: bool | None = None, device="cpu",
                        progress=None) -> dict:
    """Held-out bits per byte of any causal LM on prepared data (no teacher, no training).

    The first ``batches`` batches of the packed, unshuffled windows of ``paths`` tokenized by
    ``tok`` (the model's own tokenizer); ``add_bos`` starts every window with the BOS (None:
    the model's default, :mod:`xdistill.tokenization.bos`; Gemma needs its BOS). Returns ``{"bpb", "loss", "tokens", "bytes", "add_bos"}``.
    """
    if batches < 1:
        raise ConfigError(f"batches (eval --batches) must be >= 1, got {batches}")
    add_bos = resolve_add_bos(add_bos, tok, "add_bos (eval --bos / --no-bos)")
    cfg = DataConfig(paths=list(paths), seq_len=seq_len, batch_size=batch_size, num_workers=0,
                     shuffle=False, epochs=1, add_bos=add_bos)
    lengths_V = torch.as_tensor(tok.table.lengths_V, dtype=torch.int64)
    nll = tokens = n_bytes = 0
    model.eval()
    for i, batch in enumerate(islice(iter(build_loader(cfg, tok)), batches)):
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids_BTs.to(device),
                           attention_mask=batch.attention_mask_BTs.long().to(device)).logits
        a, b, c = nll_and_bytes(logits, batch.labels_BTs.to(device), lengths_V.to(device),
                                batch.phantom_BTs)
        nll, tokens, n_bytes = nll + a, tokens + b, n_bytes + c
        if progress is not None:
            progress(i + 1)
    if n_bytes == 0:      # bits per byte over nothing is undefined (0.0 would read as perfect)
        raise DataError(f"{', '.join(map(str, paths))}: no byte was scored (no window with a "
                        "target token); give more data or a shorter --seq-len")
    return {"bpb": nll / (math.log(2) * n_bytes), "loss": nll / max(tokens, 1),
            "tokens": tokens, "bytes": n_bytes, "add_bos": add_bos}
