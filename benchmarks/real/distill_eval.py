"""Child processes of ``benchmarks/real/distill.py``: starting figures and one arm's run.

    python benchmarks/real/distill_eval.py start <job.json>   # bpb of the three models, the
                                                             # teacher's greedy predictions
    python benchmarks/real/distill_eval.py arm <job.json>     # train one arm, evaluating on the way
    python benchmarks/real/distill_eval.py adapt <job.json>   # adapt the teacher, scoring and
                                                             # exporting candidate lengths

Teacher agreement (module doc of ``distill.py``): at every byte offset of a held-out passage where
both tokenizations start a token, the greedy next tokens agree when one's bytes are a prefix of
the other's. Predictions are keyed by byte offset, so the two tokenizations need no alignment.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import xdistill  # noqa: F401 - before torch: xdistill's OpenMP wait default (else the real study's
import torch  # runs spin at full GNU OpenMP default and collapse when another job shares the cores)


def say(msg: str) -> None:
    print(msg, flush=True)


def greedy_by_offset(model, tok, texts: list[str], add_bos: bool) -> list[dict[int, bytes]]:
    """Per text: {byte offset where a token starts: the model's greedy next-token bytes there}."""
    out = []
    was_training = model.training
    model.eval()
    for text in texts:
        enc = tok.encode(text)
        ids = [int(i) for i in enc.ids]
        lead = [tok.bos_id] if add_bos and tok.bos_id is not None else []
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([lead + ids])).logits[0, len(lead):]
        best = logits.argmax(-1).tolist()
        # position i predicts the token that starts where token i ends
        out.append({int(enc.ends[i]): tok.table.token_bytes(best[i]) for i in range(len(ids))})
    model.train(was_training)
    return out


def agreement(student: list[dict[int, bytes]], teacher: list[dict[int, bytes]]) -> float:
    hit = total = 0
    for s_map, t_map in zip(student, teacher):
        for offset in s_map.keys() & t_map.keys():
            a, b = s_map[offset], t_map[offset]
            if not a or not b:
                continue
            total += 1
            hit += a.startswith(b) or b.startswith(a)
    return hit / max(total, 1)


def save_preds(preds: list[dict[int, bytes]], path: str) -> None:
    Path(path).write_text(json.dumps([{str(k): v.hex() for k, v in p.items()} for p in preds]))


def load_preds(path: str) -> list[dict[int, bytes]]:
    return [{int(k): bytes.fromhex(v) for k, v in p.items()} for p in json.loads(Path(path).read_text())]


def held_out_bpb(model, tok, ev: dict, add_bos: bool) -> float:
    from xdistill.train.evaluate import model_bits_per_byte

    was_training = model.training
    res = model_bits_per_byte(model, tok, ev["paths"], seq_len=128, batch_size=4,
                              batches=ev["batches"], add_bos=add_bos)
    model.train(was_training)
    return res["bpb"]


def start(job: dict) -> dict:
    from xdistill.assets import model_dir
    from xdistill.student.model import load_causal_lm
    from xdistill.tokenization import load_tokenizer

    torch.set_num_threads(job["threads"])
    ev, figures = job["eval"], {}
    gemma, smol = load_tokenizer("gemma3-270m"), load_tokenizer("smollm2-135m")
    models = [("gemma3-270m stock", str(model_dir("gemma3-270m")), gemma, True),
              ("gemma3-270m adapted (teacher)", job["teacher"], gemma, True),
              ("smollm2-135m stock (student)", str(model_dir("smollm2-135m")), smol, False)]
    preds = {}
    for i, (name, path, tok, bos) in enumerate(models):
        model = load_causal_lm(path).float()
        figures[f"bpb {name}"] = held_out_bpb(model, tok, ev, bos)
        if "stock" not in name or "student" in name:
            preds[name] = greedy_by_offset(model, tok, ev["texts"], bos)
        del model
        say(f"step {i + 1}/3 | {name}: held-out bpb {figures[f'bpb {name}']:.4f}")
    teacher = preds["gemma3-270m adapted (teacher)"]
    figures["agreement smollm2-135m stock vs teacher"] = agreement(
        preds["smollm2-135m stock (student)"], teacher)
    save_preds(teacher, job["preds"])
    return {"figures": figures, "preds": job["preds"]}


def build_arm_run(cfg_dict: dict):
    """(run, config, the student's add_bos): an on-policy run when the config has a ``rollout``
    section (``onpolicy_arms.py``), else off-policy."""
    from xdistill.config import from_dict
    from xdistill.train import core

    if "rollout" in cfg_dict:
        from xdistill.train.onpolicy import OnPolicyMode
        from xdistill.train.onpolicy_config import OnPolicyConfig

        cfg = from_dict(OnPolicyConfig, cfg_dict)
        return core.build(cfg, OnPolicyMode()), cfg, False
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import OffPolicyMode

    cfg = from_dict(OffPolicyConfig, cfg_dict)
    return core.build(cfg, OffPolicyMode()), cfg, cfg.data.add_bos


def run_arm(job: dict) -> dict:
    from xdistill.train import core

    teacher = load_preds(job["teacher_preds"]) if job.get("teacher_preds") else None
    run, cfg, add_bos = build_arm_run(job["cfg"])
    ev, every, steps = job["eval"], job["eval_every"], cfg.train.steps
    tok = run.plan.student_tok

    def evaluate(step: int) -> dict:
        point = {"step": step, "bpb": held_out_bpb(run.model, tok, ev, add_bos),
                 "agree": None if teacher is None else
                 agreement(greedy_by_offset(run.model, tok, ev["texts"], False), teacher)}
        agree = "" if teacher is None else f" | agreement {point['agree']:.4f}"
        say(f"eval step {step} | held-out bpb {point['bpb']:.4f}{agree}")
        return point

    curve, losses, t0 = [evaluate(0)], [], time.perf_counter()
    run.mode.start(run)
    try:
        for step in range(1, steps + 1):
            m = core.train_step(run, step)
            losses.append(m.get("loss"))
            rate = step / (time.perf_counter() - t0)
            say(f"step {step}/{steps} | loss {m.get('loss', float('nan')):.4f} | "
                f"{m['step_s']:.2f} s/step | ETA {(steps - step) / rate:.0f} s")
            if step == steps or (every > 0 and step % every == 0):
                curve.append(evaluate(step))
        seconds = time.perf_counter() - t0
        final = {name: held_out_bpb(run.model, tok, e, add_bos)
                 for name, e in job.get("final_evals", {}).items()}   # e.g. out-of-domain text
        for name, bpb in final.items():
            say(f"final {name} bpb {bpb:.4f}")
        masters = score_masters(run.model, tok, job, add_bos) if job.get("score_masters") else {}
    finally:
        run.mode.close()
    samples = None
    if job.get("samples"):       # the student's own text, judged by the teacher (samples.py)
        from samples import sample_figures

        samples = sample_figures(run.model, tok, job["samples"])
        say(f"samples | teacher bpb {samples['teacher_bpb_on_samples']:.4f} | repetition "
            f"{samples['repetition']:.3f}")
    return {"curve": curve, "losses": losses, "seconds": seconds,
            **({"final": final} if final else {}), **({"samples": samples} if samples else {}),
            **masters}


def score_masters(model, tok, job: dict, add_bos: bool) -> dict:
    """The run's compute dtype, and the held-out bits per byte of its float32 master weights
    (what an export holds) on the job's evaluation text and its final texts: under bf16
    compute the run's own figures are the bf16 forward's."""
    from xdistill.student.mixed import compute_dtype_of, master_weights

    evals = {"eval": job["eval"], **job.get("final_evals", {})}
    with master_weights(model):
        masters = {name: held_out_bpb(model, tok, e, add_bos) for name, e in evals.items()}
    say("masters (float32) bpb | " + " | ".join(f"{k} {v:.4f}" for k, v in masters.items()))
    return {"compute_dtype": str(compute_dtype_of(model)).removeprefix("torch."),
            "masters_bpb": masters}


def adapt(job: dict) -> dict:
    """Adapt Gemma by CE on the domain (``job["cfg"]``, constant rate after warm-up) and, at each
    step of ``job["checks"]``, score validation bits per byte and export the weights to
    ``<out>/step<N>`` (so one run gives every candidate adaptation length).

    With ``job["stop_bpb"]``, the adaptation ends at the first check scoring at or below it.

    Resumable: with ``checkpoint.resume: auto`` and ``checkpoint.every`` in the config, a killed
    adaptation restarts from its latest checkpoint; the checks already scored are kept in
    ``<out>/checks_progress.json``. The checkpoints are removed once the last check is scored."""
    import shutil

    from xdistill.config import from_dict
    from xdistill.train import core
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import OffPolicyMode

    cfg = from_dict(OffPolicyConfig, job["cfg"])
    run = core.build(cfg, OffPolicyMode())
    core.maybe_resume(run)
    out, steps, t0 = Path(job["out"]), max(job["checks"]), time.perf_counter()
    progress = out / "checks_progress.json"
    points = [p for p in (json.loads(progress.read_text()) if progress.exists() else [])
              if p["step"] <= run.start_step]
    if run.start_step:
        say(f"resumed at step {run.start_step}; checks kept: {[p['step'] for p in points]}")
    stop = job.get("stop_bpb")
    if stop is not None and any(p["bpb"] <= stop for p in points):
        steps = run.start_step                  # killed after the stopping check: nothing left
    run.mode.start(run)
    try:
        for step in range(run.start_step + 1, steps + 1):
            m = core.train_step(run, step)
            rate = (step - run.start_step) / (time.perf_counter() - t0)
            say(f"step {step}/{steps} | loss {m.get('loss', float('nan')):.4f} | "
                f"{m['step_s']:.2f} s/step | ETA {(steps - step) / rate:.0f} s")
            if step in job["checks"]:
                points.append(_adapt_check(run, job, out, step))
                progress.write_text(json.dumps(points))
                if stop is not None and points[-1]["bpb"] <= stop:
                    say(f"check step {step} reaches {stop:.4f}: adaptation ends here")
                    break
            if cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0 and step < steps:
                core.save(run, step)
    finally:
        run.mode.close()
    shutil.rmtree(out / "checkpoints", ignore_errors=True)   # GBs of optimizer state
    return {"checks": points, "seconds": time.perf_counter() - t0}


def _adapt_check(run, job: dict, out: Path, step: int) -> dict:
    """Validation bits per byte at adaptation step ``step`` and the weights exported."""
    from xdistill.student.model import export_hf

    tok = run.plan.student_tok
    bpb = held_out_bpb(run.model, tok, job["eval"], True)
    folder = export_hf(run.model, out / f"step{step}", tok, dtype="float32", overwrite=True)
    say(f"check step {step} | validation bpb {bpb:.4f} | exported {folder}")
    return {"step": step, "bpb": bpb, "model": str(folder)}


def main(argv: list[str]) -> int:
    import hashlib

    kind, path = argv
    job = json.loads(Path(path).read_text())
    digest = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:12]  # = distill._digest
    if kind == "start":
        res = start(job)
        out = Path(path).with_name("start.json")
    elif kind == "arm":
        res = run_arm(job)
        out = Path(path).with_name("result.json")
    elif kind == "adapt":
        res = adapt(job)
        out = Path(path).with_name(job.get("result", "adapted.json"))
    else:
        raise SystemExit(f"unknown child kind {kind!r}: start, arm or adapt")
    out.write_text(json.dumps(dict(res, digest=digest)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
