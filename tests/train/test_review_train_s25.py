"""Review s25 (train): each test demonstrates a defect and FAILS on the reviewed code."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from xdistill.config import from_dict
from xdistill.errors import ConfigError
from xdistill.train.config import OffPolicyConfig


def tiny_run_config(tmp_path: Path, out: Path, **train) -> dict:
    """The CLI review's tiny off-policy CE run (1-layer Llama, seconds on a CPU), without
    TensorBoard and keeping every checkpoint."""
    from test_review_cli_s23 import tiny_run_config as base

    cfg = base(tmp_path, out, tensorboard=False, num_threads=1, **train)
    cfg["checkpoint"]["keep_last"] = 0
    return cfg


# ----------------------------------------------------------------------------- config validation
@pytest.mark.parametrize("section, key, value", [
    ("train", "seed", -1),                 # np.random.seed: raw ValueError after the plan
    ("train", "num_threads", -1),          # torch.set_num_threads: raw RuntimeError
    ("train", "stop_after", -2),           # "0 = never": a negative one silently never stops
    ("eval", "every", -3),                 # "-1 = never": -3 silently never evaluates
    ("optim", "weight_decay", math.nan),   # `< 0` lets NaN through: every weight becomes NaN
    ("optim", "eps", math.nan),            # `<= 0` lets NaN through: NaN updates
    ("loss", "ce_weight", math.nan),       # `< 0` lets NaN through: every step non-finite
])
def test_out_of_range_run_values_are_refused_naming_the_key(tmp_path, section, key, value):
    """Expected: ``validate_offpolicy`` (and so ``xdistill train``) refuses each of these values
    before any compute with a ConfigError naming ``<section>.<key>``, as it does for
    ``data.seed=-1``, ``train.log_every=0`` or ``optim.lr=nan`` (``not lr > 0``).

    Defect: the shared run checks (xdistill/train/run_config.py ``validate_run_sections``),
    ``OptimConfig.validate`` (xdistill/train/optim.py) and ``validate_offpolicy``
    (xdistill/train/config.py) never look at ``train.seed``, ``train.num_threads``, the sign of
    ``train.stop_after`` or ``eval.every < -1``, and compare floats with ``< 0`` / ``<= 0``,
    which NaN passes. ``train.seed=-1`` then dies in ``seed_everything`` with numpy's bare
    ``ValueError: Seed must be between 0 and 2**32 - 1`` (a traceback, after the tokenizers
    and projections were loaded), ``train.num_threads=-1`` with torch's ``RuntimeError``; a
    negative ``stop_after`` / ``eval.every`` is silently "never"; a NaN weight decay or eps
    turns every weight into NaN at the first update, a NaN ``loss.ce_weight`` makes every step
    non-finite and the run stops blaming the teachers' outputs."""
    from xdistill.train.config import validate_offpolicy

    cfg = tiny_run_config(tmp_path, tmp_path / "run", steps=3)
    cfg.setdefault(section, {})[key] = value
    if key == "stop_after":
        cfg["checkpoint"]["every"] = 2
    parsed = from_dict(OffPolicyConfig, copy.deepcopy(cfg))
    try:
        validate_offpolicy(parsed)
    except ConfigError as exc:
        assert f"{section}.{key}" in str(exc), str(exc)
    else:
        pytest.fail(f"{section}.{key}={value!r} passed validation")


# ----------------------------------------------------------------------------- gradient clipping
def test_grad_norm_of_float16_gradients_does_not_overflow():
    """Expected: ``clip_grad_norm`` returns the true global norm of finite gradients and clips
    them to ``max_norm`` whatever their dtype (``student.dtype: float16`` is an accepted master
    dtype, so gradients are float16).

    Defect: xdistill/train/optim.py ``clip_grad_norm`` computes the norm in the gradients' own
    dtype (``torch.nn.utils.get_total_norm`` on float16 tensors). A global norm above 65504
    (float16's largest value; here 10,000 gradients of 1000 each: norm 1e5, every element
    finite) comes back as ``inf``; the clip coefficient ``max_norm / inf`` then zeroes every
    gradient, and ``core.optimizer_step`` takes the step for a non-finite one and skips it
    ("non-finite gradient norm inf with a finite loss"); ``train.max_nonfinite_steps`` such
    steps stop the run. With bfloat16 gradients the norm is only rounded (8-bit mantissa).
    Fix: accumulate the norm in float32 (``get_total_norm([g.float() ...])`` or
    ``torch.linalg.vector_norm(g, dtype=torch.float32)`` per tensor), then clip."""
    from xdistill.train.optim import clip_grad_norm

    model = torch.nn.Linear(100, 100, bias=False).half()
    model.weight.grad = torch.full_like(model.weight, 1000.0)
    norm = clip_grad_norm(model, 1.0)
    assert math.isfinite(norm), f"the global norm of finite float16 gradients came back as {norm}"
    assert norm == pytest.approx(1.0e5, rel=1e-3)
    clipped = float(model.weight.grad.float().norm())
    assert clipped == pytest.approx(1.0, rel=1e-2), f"clipped to {clipped}, not 1.0"


# ----------------------------------------------------------------------------- non-finite stop
def test_a_run_stopped_by_nonfinite_steps_keeps_its_trained_steps(tmp_path, monkeypatch):
    """Expected (brief: NaN loss -> "clear error, nothing lost"): when the run stops after
    ``train.max_nonfinite_steps`` non-finite steps in a row, the weights of its finite steps
    survive in a checkpoint, as they do when finite data runs out (``core.out_of_data`` saves
    the last step first "so a resume ... continues from it") or on a stop signal. The skipped
    steps never touched the weights, so the student at the stop *is* the last good one.

    Defect: xdistill/train/core.py ``check_nonfinite`` raises the TrainingError without
    saving: with ``checkpoint.every: 0`` (only at the end, the default) a run whose loss turns
    NaN at step 3 of 8 (a teacher's NaN logits, a bad batch) ends with "No checkpoint was
    written by this run" and the two trained steps are gone; with ``checkpoint.every: N`` up to
    N - 1 steps are lost. Fix: in ``train_loop``, on the non-finite stop, ``save(run, step)``
    (unless the step's checkpoint exists) before raising, and name it in the message."""
    from xdistill.losses.multi_teacher import LossReport
    from xdistill.train import step as step_mod
    from xdistill.train.checkpoint import list_checkpoints
    from xdistill.train.core import TrainingError
    from xdistill.train.offpolicy import run_offpolicy

    real, calls = step_mod.compute_loss, {"n": 0}

    def nan_from_step_3(*args, **kwargs):
        loss, report = real(*args, **kwargs)
        calls["n"] += 1          # one micro-batch per step here
        if calls["n"] >= 3:
            loss = loss * math.nan
            report = LossReport(loss.detach(), report.ce * math.nan, {})
        return loss, report

    monkeypatch.setattr(step_mod, "compute_loss", nan_from_step_3)
    cfg = tiny_run_config(tmp_path, tmp_path / "run", steps=8, max_nonfinite_steps=2)
    with pytest.raises(TrainingError, match="2 non-finite steps in a row") as info:
        run_offpolicy(from_dict(OffPolicyConfig, cfg))
    saved = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert saved, ("the run trained 2 finite steps, then stopped on NaN losses without any "
                   f"checkpoint: {info.value}")


# ----------------------------------------------------------------------------- resume
def test_resume_with_another_decay_embeddings_setting_is_not_a_keyerror(tmp_path):
    """Expected: resuming a run with ``optim.decay_embeddings`` flipped either works (the
    config wins on resume, as ``reapply_config`` promises for the lr, betas, eps, weight decay
    and AdamW kernel: here the tied embedding moves from the decay group to the no-decay one,
    its AdamW moments kept) or is refused before any step with a CheckpointError/ConfigError
    naming ``optim.decay_embeddings``.

    Defect: the checkpoint's optimizer state holds two parameter groups of other membership
    than the groups ``build_optimizer`` made for this config (the embedding matrix is in group 0
    there, in group 1 here). ``load_checkpoint`` (xdistill/train/checkpoint.py, DCP
    ``set_state_dict``) loads it without a word and leaves group 0 without its
    hyper-parameters (no ``lr``, ``betas``, ``eps``, ``weight_decay``), and
    ``reapply_config`` (xdistill/train/optim.py) dies with a bare ``KeyError: 'betas'``: a
    traceback instead of a resumed run or a one-line error. Fix: record each group's parameter
    names (``param_groups`` has them) in the checkpoint's ``extra`` and compare them in
    ``maybe_resume``: refuse naming ``optim.decay_embeddings`` (or load the per-parameter
    moments by name into this run's groups)."""
    from xdistill.train.checkpoint import CheckpointError
    from xdistill.train.offpolicy import run_offpolicy

    def cfg(steps: int, decay_embeddings: bool) -> dict:
        c = tiny_run_config(tmp_path, tmp_path / "run", steps=steps)
        c["optim"] = {"decay_embeddings": decay_embeddings}
        c["checkpoint"]["resume"] = "auto"
        return c

    run_offpolicy(from_dict(OffPolicyConfig, cfg(2, True)))
    try:
        run_offpolicy(from_dict(OffPolicyConfig, cfg(4, False)))
    except (CheckpointError, ConfigError) as exc:
        assert "decay_embeddings" in str(exc), str(exc)
    except Exception as exc:  # noqa: BLE001 - the defect: anything but a resume or a clear refusal
        pytest.fail(f"resuming with optim.decay_embeddings changed: {type(exc).__name__}: {exc}")
