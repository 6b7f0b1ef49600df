"""Review of xdistill/train/ (session 24): tests that failed before the fixes in the same commit.

Checked and found correct (no test):

* global normalisation: every loss term is a sum over units divided by the all-reduced global
  count (``all_reduce_counts`` before the micro-batches; CE-only path ``num_valid["ce"]``);
  metrics ``SUM`` terms add up to the step's value, ``PER_UNIT`` divides by the global units;
* ``optimizer_step``: clip after all micro-batches (FSDP2 DTensor norm reduced over ranks), a
  non-finite loss or norm skips AdamW (and weight decay), the scheduler still advances, the
  streak / ``finite_steps`` bookkeeping and the stop after ``max_nonfinite_steps``;
* the LR schedule (``lr_factor``): warmup ``(s+1)/W``, cosine/linear decay, the lr a step
  reports is the one AdamW used; ``reapply_config`` recomputes the lr at ``last_epoch``;
* checkpoints: ``.tmp`` + ``COMPLETE`` + atomic rename, ``.old`` recovery, ``resume: auto``
  ignores ``.tmp`` / ``.abandoned`` / unmarked folders, keep-last keeps the highest complete
  steps, ``set_aside_newer`` renames later steps before pruning can see them;
* ``MicroBatchStream``: boundaries recorded before a step is pulled, ``state_after`` of the step
  before a data end, lookahead across step boundaries;
* on-policy: rollouts of a step generated before any update of the step, sampling seeds a
  function of (seed, step, rank, micro), ``is_offpolicy_step`` a function of config and step,
  ``loader_states`` of the step before a prompt end;
* evaluation bits per byte = sum NLL / (ln 2 * sum bytes of the predicted tokens), masked by the
  shifted labels (BOS never a target).

Failing tests (defects):

* ``test_resume_with_a_dropout_student_is_bitwise``: the torch RNG restored from a checkpoint is
  consumed again by ``mode.start`` (``iter(StatefulDataLoader)`` draws its base seed from the
  global torch generator) before the first resumed step, so any RNG user in the step (dropout
  of the student) diverges from the uninterrupted run.
* ``test_resuming_a_checkpoint_of_the_other_mode_is_refused_clearly``: ``core.save`` writes the
  mode (``extra["mode"]``) into every checkpoint but ``core.maybe_resume`` never reads it: an
  off-policy run given an on-policy checkpoint loads the prompt loader's state into its corpus
  loader and dies with a bare ``KeyError: 'windows'`` inside the data iterator (or, when the
  prompt and document counts differ, with a DataError that blames the data).
* ``test_onpolicy_resume_with_an_engine_of_its_own_weights_regenerates_the_same_samples``: with
  an engine that keeps its own copy of the weights (vLLM) and ``rollout.sync_every > 1``,
  ``OnPolicyMode.start`` syncs the engine to the *resumed* weights while the uninterrupted run's
  engine still holds those of its last sync: the resumed run samples other responses.
* ``test_reward_weights_do_not_depend_on_the_micro_batch_split``: ``scored_step`` normalises the
  reward weights ``B * softmax(r / beta)`` over each micro-batch of each rank, so the objective
  changes with ``prompts.batch_size`` / the number of ranks at a fixed global batch.
* ``test_two_ranks_whose_prompts_end_at_different_steps_stop_together`` (integration, ~65 s):
  on-policy with finite ``prompts.epochs`` and prompts the ranks do not share evenly, one rank
  runs out and waits in the core's agreement all-reduce while the other generates (FSDP
  all-gathers): the run hangs instead of stopping with the data-end error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from xdistill.config import from_dict
from xdistill.train.config import OffPolicyConfig


def tiny_run_config(tmp_path: Path, out: Path, **train) -> dict:
    """The CLI review's tiny off-policy CE run, without TensorBoard and keeping every checkpoint."""
    from test_review_cli_s23 import tiny_run_config as base

    cfg = base(tmp_path, out, tensorboard=False, **train)
    cfg["checkpoint"]["keep_last"] = 0
    return cfg


def _weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "export" / "model.safetensors"))


def test_resume_with_a_dropout_student_is_bitwise(tmp_path):
    """Defect: a run resumed from its step-2 checkpoint does not end with the weights of the
    uninterrupted run when the student uses dropout (here Llama ``attention_dropout``; GPT-2
    students have dropout by default). ``core.maybe_resume`` restores the RNG state saved after
    step 2, then ``_run_locked`` calls ``mode.start`` which creates the loader iterators:
    ``iter(StatefulDataLoader)`` draws ``_base_seed`` from the global torch generator, so the
    resumed step 3 sees a different dropout mask than step 3 of the uninterrupted run (which
    made that draw before step 1). With dropout 0 the two runs are bitwise equal.

    Expected: identical exported weights. Fix: restore the RNG states after ``mode.start`` (load
    with ``restore_rng=False``, keep the rank state, ``restore_rng_state`` right before the loop),
    or give the loaders their own ``torch.Generator`` so creating an iterator leaves the global
    generator alone."""
    from xdistill.train.offpolicy import run_offpolicy

    def cfg(out):
        c = tiny_run_config(tmp_path, out, steps=4, num_threads=1)
        c["student"]["model_config"]["attention_dropout"] = 0.5
        c["student"]["attn_implementation"] = "eager"
        c["checkpoint"].update(every=2, export_hf=True, resume="auto")
        return c

    run_offpolicy(from_dict(OffPolicyConfig, cfg(tmp_path / "full")))
    (tmp_path / "cut" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_0000002",
                    tmp_path / "cut" / "checkpoints" / "step_0000002")
    run_offpolicy(from_dict(OffPolicyConfig, cfg(tmp_path / "cut")))
    full, cut = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    differ = sorted(k for k in full if not torch.equal(full[k], cut[k]))
    assert not differ, f"resumed run's weights differ from the uninterrupted run's: {differ}"


def test_resuming_a_checkpoint_of_the_other_mode_is_refused_clearly(tmp_path):
    """Defect: ``checkpoint.resume`` pointing at a ``train onpolicy`` checkpoint in a ``train
    offpolicy`` run (e.g. to continue off-policy from an on-policy student) is not refused: the
    checkpoint's ``extra["mode"] == "onpolicy"`` (xdistill/train/core.py ``save``) is never
    compared with the run's mode in ``maybe_resume``; the one prompt-loader state is loaded into
    the one corpus loader (same count, same ``layout`` prefix when the prompt file has as many
    rows as the corpus documents), and the first ``next()`` dies with ``KeyError: 'windows'``
    deep in ``xdistill/data/dataset.py``.

    Expected: a :class:`CheckpointError` before any step saying the checkpoint was written by an
    ``onpolicy`` run. Fix: in ``maybe_resume``, compare ``state.extra.get("mode")`` with
    ``run.mode.kind`` and raise a CheckpointError naming both (or load only the model weights
    and say so)."""
    import onpolicy_helpers as oh
    import xdistill.tiny as mk
    from xdistill.train.checkpoint import CheckpointError
    from xdistill.train.offpolicy import run_offpolicy
    from xdistill.train.onpolicy import run_onpolicy
    from xdistill.train.onpolicy_config import OnPolicyConfig

    off = tiny_run_config(tmp_path, tmp_path / "off", steps=3, num_threads=1)
    off["student"]["model_config"]["max_position_embeddings"] = 128
    tok = off["student_tokenizer"]
    teacher = str(mk.save_tiny_lm(tmp_path / "teacher", tok, seed=1))
    prompts = oh.write_prompts(tmp_path / "p.jsonl", [f"Prompt number {i}" for i in range(20)])
    on = oh.onpolicy_dict(tok, [oh.teacher("t", tok, teacher, kind="k1")], prompts,
                          tmp_path / "on", steps=1)
    on["student"], on["prompts"]["batch_size"] = off["student"], 1
    on["checkpoint"]["every"] = 1
    run_onpolicy(from_dict(OnPolicyConfig, on))
    ckpt = tmp_path / "on" / "checkpoints" / "step_0000001"
    assert (ckpt / "COMPLETE").is_file()
    off["checkpoint"]["resume"] = str(ckpt)
    try:
        run_offpolicy(from_dict(OffPolicyConfig, off))
    except CheckpointError as exc:
        assert "onpolicy" in str(exc)
    except Exception as exc:  # noqa: BLE001 - the defect: anything but a clear refusal
        pytest.fail(f"an on-policy checkpoint resumed off-policy: {type(exc).__name__}: {exc} "
                    "(expected a CheckpointError naming the mode)")
    else:
        pytest.fail("an on-policy checkpoint was resumed by an off-policy run without a word")


def _onpolicy_cfg(tmp_path: Path, out: Path, **rollout) -> dict:
    import onpolicy_helpers as oh
    import xdistill.tiny as mk

    base = tiny_run_config(tmp_path, out, steps=3, num_threads=1)
    base["student"]["model_config"]["max_position_embeddings"] = 128
    tok = base["student_tokenizer"]
    teacher_dir = tmp_path / "teacher"
    teacher = str(teacher_dir if teacher_dir.is_dir() else mk.save_tiny_lm(teacher_dir, tok, seed=1))
    prompts = oh.write_prompts(tmp_path / "p.jsonl")
    cfg = oh.onpolicy_dict(tok, [oh.teacher("t", tok, teacher, kind="k1")], prompts, out,
                           steps=3)
    cfg["student"] = base["student"]
    cfg["rollout"].update(rollout)
    cfg["checkpoint"].update(every=1, keep_last=0, export_hf=True)
    cfg["train"]["tensorboard"] = False
    return cfg


def test_onpolicy_resume_with_an_engine_of_its_own_weights_regenerates_the_same_samples(
        tmp_path, monkeypatch):
    """Defect: xdistill/train/onpolicy.py ``OnPolicyMode.start`` calls
    ``engine.sync_weights(run.model)`` after a resume, and ``after_update`` syncs only every
    ``rollout.sync_every`` steps. With an engine that holds its own copy of the weights (vLLM:
    what ``sync_weights`` exists for; here an ``HFGenerateEngine`` over a copy of the student,
    updated only by ``sync_weights``) and ``sync_every = 2``, the uninterrupted run samples step
    2 with the weights of its last sync (step 0), the run resumed from the step-1 checkpoint with
    the step-1 weights: other responses, other behaviour log-probs, other final weights.

    Expected (module doc: "a resumed run regenerates exactly the same samples"): the same
    responses at every step. Fix: make the engine's weights part of what a checkpoint pins down,
    e.g. sync the engine whenever a checkpoint is written (both runs then agree), or refuse
    resuming from a step that is not a multiple of ``rollout.sync_every``."""
    import copy
    import json

    from xdistill.rollout.engine import HFGenerateEngine
    from xdistill.train import onpolicy
    from xdistill.train.onpolicy_config import OnPolicyConfig

    class OwnWeightsEngine(HFGenerateEngine):
        """Generates with its own copy of the student, brought up to date by sync_weights."""

        def __init__(self, config, model, tok):
            super().__init__(copy.deepcopy(model), tok, max_prompt_len=config.max_prompt_len,
                             add_bos=config.add_bos)

        def sync_weights(self, model) -> None:
            self.model.load_state_dict(model.state_dict())

    monkeypatch.setattr(onpolicy, "build_engine", OwnWeightsEngine)

    def responses(out: Path) -> dict:
        lines = (out / "samples_rank0.jsonl").read_text().splitlines()
        return {r["step"]: r["responses"] for r in map(json.loads, lines)}

    onpolicy.run_onpolicy(from_dict(OnPolicyConfig,
                                    _onpolicy_cfg(tmp_path, tmp_path / "full", sync_every=2)))
    (tmp_path / "cut" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_0000001",
                    tmp_path / "cut" / "checkpoints" / "step_0000001")
    onpolicy.run_onpolicy(from_dict(OnPolicyConfig,
                                    _onpolicy_cfg(tmp_path, tmp_path / "cut", sync_every=2)))
    full, cut = responses(tmp_path / "full"), responses(tmp_path / "cut")
    assert sorted(cut) == [2, 3]
    assert {s: full[s] for s in (2, 3)} == cut, "the resumed run sampled other responses"
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_reward_weights_do_not_depend_on_the_micro_batch_split():
    """Defect: xdistill/train/onpolicy_step.py ``scored_step`` -> ``sample_weights(scored,
    beta)`` computes ``B * softmax(rewards / beta)`` over the B samples of *one micro-batch on
    one rank*. The trainer's contract (xdistill/train/step.py, onpolicy_step.py module docs) is
    that a step's update equals one process on the whole global batch, whatever the split into
    micro-batches and ranks; with ``loss.reward_beta > 0`` it does not: the same four rollouts
    (rewards 0, 1, 2, 3) get weights [0.13, 0.35, 0.95, 2.58] as one micro-batch of 4
    (``prompts.batch_size = 4``) but [0.54, 1.46, 0.54, 1.46] as two micro-batches of 2
    (``prompts.batch_size = 2``, same ``train.global_batch_size``), or on two ranks.

    Expected: each sample's weight is a function of the whole global batch's rewards. Fix:
    normalise over the step: sum ``exp(r / beta)`` (after subtracting the global max) over all
    micro-batches and ranks with the same all-reduce as ``num_valid``, then
    ``w = N_global * exp(r / beta) / sum``."""
    from types import SimpleNamespace

    from xdistill.train.onpolicy_step import sample_weights, step_reward_norm

    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0])
    one = SimpleNamespace(rewards_B=rewards)
    whole = sample_weights(one, 1.0, step_reward_norm([one], 1.0))
    torch.testing.assert_close(whole, (4 * torch.softmax(rewards.double(), 0)).float())
    parts = [SimpleNamespace(rewards_B=rewards[:2]), SimpleNamespace(rewards_B=rewards[2:])]
    norm = step_reward_norm(parts, 1.0)          # what the mode computes once per step
    halves = torch.cat([sample_weights(p, 1.0, norm) for p in parts])
    torch.testing.assert_close(halves, whole, msg=lambda m: (
        f"the same 4 rollouts are weighted {halves.tolist()} in two micro-batches and "
        f"{whole.tolist()} in one\n{m}"))


@pytest.mark.integration
def test_two_ranks_whose_prompts_end_at_different_steps_stop_together(tmp_path):
    """Defect: xdistill/train/onpolicy.py ``OnPolicyMode.micro_batches`` reads the step's prompts
    and then *generates* before returning; ``core.agreed_micro_batches`` makes the ranks agree
    on a data end only after that. Prompts are sharded every ``R``-th (xdistill/rollout/prompts.py),
    so 5 prompts on 2 ranks give rank 0 three and rank 1 two. With ``prompts.epochs: 1`` and one
    prompt per rank per step, at step 3 rank 1 raises DataExhausted and waits in the
    agreement's ``all_reduce_max`` while rank 0 runs ``generate(synced_gpus=True)`` on the FSDP
    student (all-gathers): the collectives never match and the run hangs (steps 1-2 trained,
    then nothing; with 6 prompts the same run stops in ~8 s with the one-line data-end error).

    Expected: both ranks stop after step 2 with the data-end error naming rank 1's prompts and
    the step-2 checkpoint. Fix: in ``micro_batches`` agree on the end of the prompts (one small
    all-reduce of "ran out", as ``agreed_micro_batches`` does) after reading them and before
    any generation, or read the prompts in ``micro_batches`` and generate in ``micro_step``."""
    import subprocess
    import sys
    import time

    import onpolicy_helpers as oh
    from distributed_helpers import free_port
    from train_helpers import REPO, _env, write_config

    cfg = _onpolicy_cfg(tmp_path, tmp_path / "run")
    oh.write_prompts(tmp_path / "p.jsonl", oh.PROMPTS[:5])
    cfg["prompts"].update(batch_size=1, epochs=1, shuffle=False)
    cfg["train"].update(steps=6, log_samples=False)
    cfg["checkpoint"].update(every=0, export_hf=False)
    path = write_config(tmp_path / "uneven.yaml", cfg)
    port = str(free_port())
    procs = []
    # the two ranks are started directly with torchrun's environment (not under torchrun, whose
    # workers outlive a killed torchrun), so that a hung run can be ended by their ids
    for rank in range(2):
        env = _env({"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        with open(tmp_path / f"rank{rank}.err", "w", encoding="utf-8") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "xdistill.cli", "train", "onpolicy", "--config",
                 str(path)], env=env, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True))
    deadline, hung = time.monotonic() + 60, False
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
    if hung:
        for p in procs:            # only the processes this test started, by their id
            if p.poll() is None:
                p.kill()
                p.wait()
        pytest.fail("2 ranks whose prompt shards end at different steps hung (no exit within "
                    "60 s) instead of stopping after step 2 with the data-end error")
    err = "".join((tmp_path / f"rank{r}.err").read_text() for r in range(2))
    proc = procs[0]
    assert proc.returncode != 0
    assert "ran out after step 2" in err and "rank 1" in err, err[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step_0000002" / "COMPLETE").is_file()


def test_the_onpolicy_step_normalises_reward_weights_over_all_its_micro_batches(tmp_path,
                                                                                monkeypatch):
    """The trainer computes the reward normaliser once per step over every micro-batch (two of
    two prompts each here) and hands that one normaliser to each micro-step."""
    from xdistill.train import onpolicy, onpolicy_step
    from xdistill.train.onpolicy_config import OnPolicyConfig

    seen, used = [], []
    real_norm, real_weights = onpolicy.step_reward_norm, onpolicy_step.sample_weights

    def norm(batches, beta):
        out = real_norm(batches, beta)
        seen.append(([b.rewards_B.tolist() for b in batches], out))
        return out

    def weights(scored, beta, n):
        used.append(n)
        return real_weights(scored, beta, n)

    monkeypatch.setattr(onpolicy, "step_reward_norm", norm)
    monkeypatch.setattr(onpolicy_step, "sample_weights", weights)
    cfg = _onpolicy_cfg(tmp_path, tmp_path / "run")
    cfg["prompts"]["batch_size"] = 2
    cfg["train"]["global_batch_size"] = 4
    cfg["loss"]["reward_beta"] = 0.5
    cfg["checkpoint"].update(every=0, export_hf=False)
    onpolicy.run_onpolicy(from_dict(OnPolicyConfig, cfg),
                          reward_fn=lambda ro: [float(n) for n in ro.response_len_B])
    assert len(seen) == 3 and all(len(rs) == 2 and all(len(r) == 2 for r in rs) for rs, _ in seen)
    for rs, n in seen:
        flat = torch.tensor([x for r in rs for x in r], dtype=torch.float64) / 0.5
        assert n.count == 4 and n.log_norm == pytest.approx(float(torch.logsumexp(flat, 0)))
    assert [id(n) for n in used] == [id(n) for _, n in seen for _ in range(2)]
