"""Where the data ends, and what the trainer keeps of where it is.

* :class:`MicroBatchStream` keeps only the loader states a checkpoint can still ask for (once it
  recorded one per step and dropped them only at a checkpoint: with ``checkpoint.every: 0`` they
  grew for the whole run), and those states still restore the loaders exactly.
* Finite data (``data.epochs`` off-policy, ``prompts.epochs`` on-policy) with more ``train.steps``
  than it covers: the run once died with a bare ``StopIteration`` (no message, no checkpoint, all
  progress lost). Now it checkpoints the last full step, then stops with one ``TrainingError``
  line naming the step, the data and the keys; resuming from that checkpoint works.
"""

from __future__ import annotations

import json

import pytest
import torch
import train_helpers as T
from safetensors.torch import load_file

from xdistill.config import from_dict
from xdistill.data.loader import stateful_loader
from xdistill.errors import XDistillError
from xdistill.rollout import PromptDataset, collate_prompts, open_prompts
from xdistill.train.pipeline import MicroBatchStream

PROMPTS = [f"prompt number {i}" for i in range(14)]


def _prompt_file(tmp_path, n: int = len(PROMPTS)) -> str:
    path = tmp_path / f"prompts{n}.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:n]))
    return str(path)


def _loader(path: str, seed: int, epochs: int | None, state=None):
    """A real resumable loader: batches of 2 ``(indices, prompts)``, shuffled per epoch."""
    ds = PromptDataset(open_prompts([path]), seed=seed, shuffle=True, epochs=epochs)
    loader = stateful_loader(ds, batch_size=2, collate_fn=collate_prompts, num_workers=0)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def _stream(loaders, lookahead: int, **kw) -> MicroBatchStream:
    return MicroBatchStream([iter(ld) for ld in loaders], loaders, accum=2, lookahead=lookahead,
                            **kw)


def _run_step(stream, step: int) -> list:
    micros = stream.peek_step(step)
    for m in micros:
        stream.consume(m)
    return [m.batch for m in micros]


@pytest.mark.parametrize("lookahead", [0, 3, 9])
def test_stream_keeps_only_the_boundaries_a_checkpoint_can_ask_for(tmp_path, lookahead):
    """300 steps without a checkpoint: at most the prefetched steps' loader states are held (the
    old stream held all 300). States asked for at any step restore fresh loaders bitwise: they
    yield exactly the micro-batches the stream gave the next step."""
    path = _prompt_file(tmp_path)
    loaders = [_loader(path, seed, None) for seed in (0, 1)]
    stream = _stream(loaders, lookahead)
    per_step = stream.per_step   # 2 loaders x accum 2
    bound = -(-lookahead // per_step)   # the steps the lookahead reaches into
    given, states = {}, {}
    for step in range(1, 301):
        given[step] = _run_step(stream, step)
        assert len(stream._boundary) <= bound, (step, sorted(stream._boundary))
        if step % 37 == 0 or step == 1:
            states[step] = stream.state_after(step)
    for step, st in states.items():
        fresh = [_loader(path, seed, None, state) for seed, state in zip((0, 1), st)]
        want = [b for ld in fresh for b, _ in zip(ld, range(2))]
        assert want == given[step + 1], step


@pytest.mark.parametrize("n_prompts", [12, 14])   # 3 full steps; 3 and one batch of step 4
@pytest.mark.parametrize("lookahead", [0, 3])
def test_a_stream_that_runs_out_stops_at_the_first_step_it_cannot_fill(tmp_path, n_prompts,
                                                                        lookahead):
    """One pass over 12 (or 14) prompts in batches of 2, 2 micro-batches a step: steps 1-3 come
    whole (also when the lookahead ran into the end while step 3 was consumed), step 4 is
    DataExhausted naming the data, and the states after step 3 continue a second pass exactly
    where an uninterrupted 2-pass loader goes on."""
    from xdistill.train.core import DataExhausted

    path = _prompt_file(tmp_path, n_prompts)
    stream = _stream([_loader(path, 0, 1)], lookahead, data="the prompts", epochs_key="x.epochs")
    got = [b for step in (1, 2, 3) for b in _run_step(stream, step)]
    with pytest.raises(DataExhausted, match=r"^step 4: the prompts ran out \(x.epochs\)$"):
        stream.peek_step(4)
    resumed = _loader(path, 0, 2, stream.state_after(3)[0])
    whole = list(_loader(path, 0, 2))
    assert got == whole[:6] and list(resumed) == whole[6:]


# ---------------------------------------------------------------------------------- off-policy
def _offpolicy_cfg(assets: dict, corpus: str, out, steps: int, epochs: int | None) -> dict:
    d = T.base_config(assets, out)
    d["teachers"] = d["teachers"][1:]   # the same-tokenizer teacher (fast)
    d["data"].update(paths=[corpus], epochs=epochs)
    d["scheduler"] = {"kind": "cosine", "warmup_steps": 2, "total_steps": 40}   # not train.steps
    d["train"].update(steps=steps, log_samples=False)
    d["checkpoint"]["export_hf"] = True
    return d


def _same_weights(a, b) -> bool:
    wa = load_file(str(a / "export" / "model.safetensors"))
    wb = load_file(str(b / "export" / "model.safetensors"))
    return sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.integration
def test_offpolicy_data_that_runs_out_checkpoints_and_fails_with_one_line(tmp_path, tiny_assets):
    """data.epochs 1 over a small corpus, train.steps 40: the CLI ends with exit 2 and one line
    naming the step, the data and the keys; the last full step is checkpointed, nothing exported.
    Resuming with train.steps at that step exports the weights an uninterrupted run of that many
    steps ends with (bitwise); resuming with data.epochs 2 trains on past it."""
    import xdistill.tiny as mk
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    corpus, _ = mk.make_corpus(tmp_path / "corpus", n_train=12, n_eval=1, max_chars=300)
    out = tmp_path / "cut"
    cfg = T.write_config(tmp_path / "cut.yaml",
                         _offpolicy_cfg(tiny_assets, str(corpus), out, 40, epochs=1))
    proc = T.run_cli(["train", "offpolicy", "--config", str(cfg)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    done = max(r["step"] for r in T.train_records(out))
    assert 2 <= done < 39, done
    ckpt = out / "checkpoints" / f"step_{done:07d}"
    assert last == (
        f"xdistill: error: step {done + 1}: the training data (data.paths) ran out after step "
        f"{done} of train.steps=40 (data.epochs is finite); raise data.epochs (null = endless) or "
        f"set train.steps to {done}. Nothing was exported. The checkpoint of step {done} is "
        f"{ckpt}: run again after the change to resume from it."), last
    assert (ckpt / "COMPLETE").is_file() and not (out / "export").exists()

    # the checkpoint holds step `done` exactly: resumed at train.steps = done, it exports what an
    # uninterrupted run of `done` steps ends with
    run_offpolicy(from_dict(OffPolicyConfig, _offpolicy_cfg(tiny_assets, str(corpus), out, done,
                                                            epochs=1)))
    run_offpolicy(from_dict(OffPolicyConfig, _offpolicy_cfg(tiny_assets, str(corpus),
                                                            tmp_path / "whole", done, epochs=1)))
    assert _same_weights(out, tmp_path / "whole")
    # a second pass over the data: the run goes on from the checkpoint
    run_offpolicy(from_dict(OffPolicyConfig, _offpolicy_cfg(tiny_assets, str(corpus), out,
                                                            done + 2, epochs=2)))
    steps = [r["step"] for r in T.train_records(out)]
    assert steps == list(range(1, done + 3)), steps


# ----------------------------------------------------------------------------------- on-policy
def test_onpolicy_prompts_that_run_out_checkpoint_and_resume_bitwise(tmp_path, tiny_assets):
    """prompts.epochs 1 (8 prompts, batches of 4: 2 steps), train.steps 3: one TrainingError line
    naming step 3, the prompts and the keys, after a checkpoint of step 2. Resumed with
    prompts.epochs 2 it ends bitwise where an uninterrupted 2-pass run of 3 steps ends."""
    import onpolicy_helpers as H

    from xdistill.train.onpolicy import run_onpolicy
    from xdistill.train.onpolicy_config import OnPolicyConfig

    teacher = H.save_lm(tmp_path / "t", tiny_assets["tok_s"], seed=1, logit_scale=5.0)
    prompts = H.write_prompts(tmp_path / "p.jsonl", H.PROMPTS[:8])

    def cfg(out, epochs):
        d = H.onpolicy_dict(tiny_assets["tok_s"], [H.teacher("same", tiny_assets["tok_s"],
                                                             teacher, "k3")], prompts, out, steps=3)
        d["prompts"]["epochs"] = epochs
        d["rollout"]["max_new_tokens"] = 6
        d["checkpoint"]["export_hf"] = True
        return from_dict(OnPolicyConfig, d)

    with pytest.raises(XDistillError) as err:
        run_onpolicy(cfg(tmp_path / "cut", 1))
    ckpt = tmp_path / "cut" / "checkpoints" / "step_0000002"
    assert type(err.value).__name__ == "TrainingError" and str(err.value) == (
        "step 3: the prompts (prompts.paths) ran out after step 2 of train.steps=3 (prompts.epochs "
        "is finite); raise prompts.epochs (null = endless) or set train.steps to 2. Nothing was "
        f"exported. The checkpoint of step 2 is {ckpt}: run again after the change to resume "
        "from it.")
    assert (ckpt / "COMPLETE").is_file() and not (tmp_path / "cut" / "export").exists()
    run_onpolicy(cfg(tmp_path / "cut", 2))
    run_onpolicy(cfg(tmp_path / "whole", 2))
    assert _same_weights(tmp_path / "cut", tmp_path / "whole")

    def samples(out):
        lines = (out / "samples_rank0.jsonl").read_text().splitlines()
        return {r["step"]: r["prompts"] for r in map(json.loads, lines)}

    assert samples(tmp_path / "cut") == samples(tmp_path / "whole")


@pytest.mark.integration
def test_two_ranks_whose_data_ends_at_different_steps_stop_together(tmp_path, tiny_assets):
    """data.epochs 1 over 4 documents, 2 ranks: rank 0 reads the two long ones, rank 1 the two
    short ones, so rank 1 runs out steps before rank 0. Rank 1 alone once went to checkpoint while
    rank 0 waited in the step's collectives: the run hung. Now both ranks stop at the same step:
    the checkpoint of the step before is written (by both) and the error names rank 1's data."""
    import xdistill.tiny as mk
    from xdistill.data.prepare import prepare

    text = " ".join(mk.passages(limit=150))
    docs = [text[:2400], text[3000:3500], text[4000:6400], text[7000:7500]]
    raw = tmp_path / "uneven.jsonl"
    raw.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    prepare([raw], tmp_path / "uneven", progress=False, overwrite=True)
    out = tmp_path / "run"
    d = _offpolicy_cfg(tiny_assets, str(tmp_path / "uneven"), out, 40, epochs=1)
    d["data"]["shuffle"] = False
    cfg = T.write_config(tmp_path / "uneven.yaml", d)
    proc = T.run_cli(["train", "offpolicy", "--config", str(cfg)], nproc=2, timeout=240)
    assert proc.returncode != 0, proc.stderr[-3000:]
    done = max(r["step"] for r in T.train_records(out))
    assert 1 <= done < 39, done
    want = (f"step {done + 1}: the training data (data.paths) of rank 1 ran out after step {done} "
            f"of train.steps=40 (data.epochs is finite)")
    assert want in proc.stderr, proc.stderr[-3000:]
    assert (out / "checkpoints" / f"step_{done:07d}" / "COMPLETE").is_file()
    assert not (out / "export").exists()
