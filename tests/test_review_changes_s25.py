"""Review s25 (today's changes): each test demonstrates a defect and FAILS on the reviewed code."""

from __future__ import annotations

import logging
import math
import re
import types
from pathlib import Path

import pytest

from xdistill.config import from_dict
from xdistill.errors import ConfigError, XDistillError


# ----------------------------------------------------------------------------- config helpers
def _offpolicy_cfg(tmp_path: Path, teacher_loss: dict | None = None, **loss) -> dict:
    """A minimal off-policy config that passes ``validate_offpolicy`` (no compute)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\n")
    cfg = {"student_tokenizer": "gpt2", "data": {"paths": [str(corpus)]},
           "loss": {"ce_weight": 1.0, **loss}, "train": {"out_dir": str(tmp_path / "run")},
           "checkpoint": {"export_hf": False}, "eval": {"every": -1}}
    if teacher_loss is not None:
        model = tmp_path / "teacher-model"
        model.mkdir(exist_ok=True)
        cfg["teachers"] = [{"name": "t", "worker": {"model": str(model)},
                            "loss": {"kind": "forward_kl", **teacher_loss}}]
    return cfg


def _onpolicy_cfg(tmp_path: Path):
    """A minimal k3 on-policy config that passes ``validate_onpolicy`` (as
    tests/train/test_onpolicy_config.py builds it)."""
    from xdistill.train.onpolicy_config import OnPolicyConfig

    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    t = {"name": "t", "worker": {"model": str(model)}, "loss": {"kind": "k3"}}
    return from_dict(OnPolicyConfig, {"student_tokenizer": "gpt2", "teachers": [t],
                                      "prompts": {"paths": [str(prompts)]}})


# ----------------------------------------------------------------------------- NaN siblings
@pytest.mark.parametrize("key", ["weight", "temperature"])
def test_nan_teacher_loss_weight_or_temperature_is_refused(tmp_path, key):
    """Expected: ``teachers.N.loss.weight`` / ``.temperature`` = NaN is refused before any
    compute with a ConfigError naming the key, like the NaN ``optim.eps``/``weight_decay``/
    ``grad_clip`` and ``loss.ce_weight`` that today's train commit (a95ec93) now refuses.

    Actual: the sibling check ``check_loss_scale`` (xdistill/train/run_config.py) still
    compares with ``temperature <= 0 or weight < 0``, which NaN passes, so the config is
    accepted (off- and on-policy both use it); a NaN weight or temperature makes that
    teacher's term, hence every step, non-finite, and the run stops blaming the teachers'
    outputs."""
    from xdistill.train.config import OffPolicyConfig, validate_offpolicy

    cfg = from_dict(OffPolicyConfig, _offpolicy_cfg(tmp_path, {key: math.nan}))
    with pytest.raises(ConfigError, match=rf"teachers\.0\.loss"):
        validate_offpolicy(cfg)


def test_nan_dynamic_weighting_alpha_is_refused(tmp_path):
    """Expected: ``loss.alpha`` = NaN with ``loss.weighting: dynamic`` is a ConfigError naming
    ``loss.alpha`` (the same NaN class as the ``loss.ce_weight`` fixed today).

    Actual: ``validate_offpolicy`` (xdistill/train/config.py) never looks at ``loss.alpha``;
    ``MultiTeacherLoss.weights`` then computes ``softmax(nan * score + log prior)`` = NaN
    weights for every teacher, so every step is non-finite."""
    from xdistill.train.config import OffPolicyConfig, validate_offpolicy

    cfg = from_dict(OffPolicyConfig, _offpolicy_cfg(tmp_path, weighting="dynamic",
                                                    alpha=math.nan))
    with pytest.raises(ConfigError, match=r"loss\.alpha"):
        validate_offpolicy(cfg)


@pytest.mark.parametrize("section, key, value", [
    ("offpolicy", "ce_weight", math.nan),   # the on-policy twin of loss.ce_weight (fixed today)
    ("loss", "reward_beta", math.nan),      # `< 0` lets NaN through: NaN sample weights
    ("loss", "loss_max", -1.0),             # k3: math.log1p(-1) -> ValueError at the 1st step
])
def test_onpolicy_out_of_range_values_are_refused(tmp_path, section, key, value):
    """Expected: ``validate_onpolicy`` refuses these with a ConfigError naming
    ``<section>.<key>``, as the off-policy ``loss.ce_weight=nan`` now is.

    Actual (xdistill/train/onpolicy_config.py ``validate_onpolicy``): ``offpolicy.ce_weight``
    and ``loss.reward_beta`` are checked with ``< 0`` (NaN passes: the fix of a95ec93 was not
    carried over to the on-policy config), and ``loss.loss_max`` is not checked at all. Today's
    k3 change (losses/onpolicy_sampled.py ``rc_N.clamp_max(2.0 * math.log1p(hi) + 1.0)``) turns
    a ``loss_max <= -1`` from silently wrong losses into a bare ``ValueError: math domain
    error`` inside the first training step."""
    from xdistill.train.onpolicy_config import validate_onpolicy

    cfg = _onpolicy_cfg(tmp_path)
    setattr(getattr(cfg, section), key, value)
    with pytest.raises(ConfigError, match=re.escape(f"{section}.{key}")):
        validate_onpolicy(cfg)


# ----------------------------------------------------------------------------- student
def test_parallelize_student_config_error_leaves_the_model_untouched(monkeypatch):
    """Expected (commit 89a6f54, and the comment in ``parallelize_student``: "before the model
    is touched: a config error leaves it as it was"): a ConfigError raised by
    ``parallelize_student`` leaves the model as it was.

    Actual (xdistill/student/parallelize.py, the one-process branch): activation checkpointing
    is applied to the layers *before* ``cfg.compute_dtypes(device)``, which raises a
    ConfigError for an invalid ``XDISTILL_AUTO_DTYPE`` with ``param_dtype: auto``; the error
    comes with every decoder layer already replaced by a ``CheckpointWrapper``."""
    from distributed_helpers import TINY_LLAMA
    from xdistill.precision import ENV_OVERRIDE
    from xdistill.student.config import StudentConfig
    from xdistill.student.model import build_causal_lm
    from xdistill.student.parallelize import find_decoder_layers, parallelize_student

    model = build_causal_lm("llama", TINY_LLAMA)
    before = [type(layer).__name__ for layer in find_decoder_layers(model)]
    cfg = StudentConfig(model_type="llama", model_config=TINY_LLAMA, param_dtype="auto",
                        activation_checkpointing=True)
    monkeypatch.setenv(ENV_OVERRIDE, "bogus")
    with pytest.raises(ConfigError, match=ENV_OVERRIDE):
        parallelize_student(model, None, cfg, device="cpu")
    after = [type(layer).__name__ for layer in find_decoder_layers(model)]
    assert after == before, f"the failed call wrapped the layers: {before} -> {after}"


def test_export_below_a_file_is_one_clear_error(tmp_path):
    """Expected: like exporting onto a file (fixed today: "export folder ... is a file, not a
    folder"), exporting to a folder *inside* a file's path is an XDistillError naming the
    path, so ``xdistill train``/``export`` print one line.

    Actual (xdistill/student/model.py ``export_hf``): only ``out`` itself is checked;
    ``out.exists()`` is False below a file, and ``_write_export``'s ``tmp.mkdir`` raises a bare
    ``NotADirectoryError`` (the exception class the fix was meant to replace), which the CLI
    (catching only XDistillError) shows as a traceback."""
    from distributed_helpers import TINY_LLAMA
    from xdistill.student.model import build_causal_lm, export_hf

    blocker = tmp_path / "model"
    blocker.write_text("keep me")
    try:
        export_hf(build_causal_lm("llama", TINY_LLAMA), blocker / "export")
    except XDistillError as exc:
        assert "model" in str(exc)
    except OSError as exc:
        pytest.fail(f"bare {type(exc).__name__}: {exc}")
    else:
        pytest.fail("exporting below a file succeeded")
    assert blocker.read_text() == "keep me"


# ----------------------------------------------------------------------------- Ray teacher
def test_await_death_warning_does_not_claim_a_silent_actor_answered(monkeypatch, caplog):
    """Expected: ``_await_death``'s warning describes what happened. When the readiness probe
    times out (the killed actor never answered within the wait), it must not say the actor
    "still answered".

    Actual (xdistill/teacher/remote_client.py ``_await_death``): a ``GetTimeoutError`` breaks
    out of the loop into the same warning as an actor that kept answering for 10 s: "its Ray
    actor still answered 10 s after ray.kill" -- the opposite of what was observed (it did
    not answer at all), which misleads whoever debugs a hung teacher."""
    pytest.importorskip("ray")
    import ray
    from ray.exceptions import GetTimeoutError

    from xdistill.teacher import remote_client

    def timed_out(*_args, **_kwargs):
        raise GetTimeoutError("Get timed out: some object(s) not ready.")

    monkeypatch.setattr(ray, "get", timed_out)
    actor = types.SimpleNamespace(**{"__ray_ready__": types.SimpleNamespace(remote=lambda: None)})
    with caplog.at_level(logging.WARNING, logger=remote_client.__name__):
        remote_client._await_death(actor, "t")
    text = " ".join(r.getMessage() for r in caplog.records)
    assert text, "no warning at all"
    assert "still answered" not in text, text


# ----------------------------------------------------------------------------- phantom bytes
def test_align_show_uses_the_per_token_phantom_bytes(capsys):
    """Expected: ``xdistill align show`` prints the alignment the aligner gives the two
    encodings it made, with their per-token phantom bytes (``Encoding.phantom_T``: "The aligner
    takes it as s_phantom_BTs / t_phantom_BTt"), as the collator now does for both sides
    (commit 76b81b3) and ``projection.corpus`` does.

    Actual (xdistill/commands/align.py ``main``): it still passes only ``phantom_prefix``
    (``s_phantom=s_enc.phantom_prefix``), so Phi-3's dummy space after each in-text special
    token counts as a real space: here student coverage 40% instead of the 60% the trainer's
    alignment gets (the same defect fixed today in the packer/collator, left in this sibling)."""
    from xdistill import cli
    from xdistill.align import align_pair
    from xdistill.tokenization import load_tokenizer

    text = "Sure thing.<|end|>Why not?<|end|>Because."
    s_tok, t_tok = load_tokenizer("phi3"), load_tokenizer("qwen2")
    se = s_tok.encode(text, add_special_tokens=False)
    te = t_tok.encode(text, add_special_tokens=False)
    assert int(se.phantom_bytes_T()[1:].sum()) > 0     # the premise: in-text phantom spaces
    want = align_pair(se.ids, te.ids, s_tok.table, t_tok.table,
                      s_phantom=se.phantom_bytes_T(), t_phantom=te.phantom_bytes_T())
    assert cli.main(["align", "show", "--student", "phi3", "--teacher", "qwen2",
                     "--text", text]) == 0
    out = capsys.readouterr().out
    shown = re.search(r"coverage: student ([\d.]+)%", out)
    assert shown, out
    assert float(shown.group(1)) == pytest.approx(100 * float(want.s_coverage_B[0]), abs=0.1), out
