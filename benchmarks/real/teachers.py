"""The real study's teacher stage (``PROTOCOL.md``, stage 2): Gemma-3-270M adapted by CE on the
domain, scored on validation, exported, and chosen by the amendment's rule.

Two rules (``study.AMENDMENTS``, ``teacher``):

``constant``  (as first written, amendment 2) one adaptation at a constant rate after a short
              warm-up, scored and exported at each of ``args.checks``; the teacher is the first
              check that leads CE-only by ``LEAD``, else the last (``plays``) or best (``blocks``)
              check, the shortfall reported.
``cosine``    (amendment 4) one adaptation per candidate of ``args.candidates`` = (peak rate,
              steps), each with ``WARMUP`` warm-up steps and a cosine decay to zero at its last
              step, scored and exported there; every candidate runs, and the teacher is the
              lowest validation bits per byte (ties: fewer steps, then the lower rate), with its
              lead over CE-only reported against ``LEAD``.

Every adaptation is resumable (``distill_eval.adapt``: checkpoints every
``CHECKPOINT_EVERY`` steps) and cached by its job; a chosen teacher lost with its run folder (a
new machine) is rebuilt by the same adaptation and must score its recorded figure again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import distill  # this script's folder is on the path when it runs

HERE = Path(__file__).resolve().parent
LEAD = 0.15              # bits/byte the teacher should lead CE-only by on validation
TOL = 2e-3               # bits/byte: a rebuilt teacher must score its recorded validation figure
CHECKPOINT_EVERY = 30    # adaptation steps between checkpoints (~4 min each in float32 here)
WARMUP = 10              # amendment 4's warm-up steps (amendment 2's: 60 // 6 = 10 as well)
say = distill.say


def adapt(args, ev: dict, data: dict, checks, stop_bpb=None, name: str = "adapted",
          schedule: dict | None = None, folder: str = "teacher_v2") -> list[dict]:
    """One adaptation of Gemma-3-270M by CE on the domain under ``<out>/<folder>``, scored on
    validation and exported at each of ``checks`` (resumable; cached by its job in
    ``<name>.json``); its checks. ``schedule`` = {lr, kind, min_lr_ratio, warmup_steps} replaces
    the constant rate (``args.teacher_lr``) of the rule as first written."""
    out = args.out / folder
    cfg = distill.teacher_config(args, {"domain": data["domain"]}, out)
    cfg["scheduler"] = {"kind": "constant", "warmup_steps": max(1, args.checks[0] // 6)}
    if schedule is not None:
        cfg["optim"]["lr"] = schedule["lr"]
        cfg["scheduler"] = {k: schedule[k] for k in ("kind", "warmup_steps", "min_lr_ratio")}
    cfg["train"]["steps"] = max(checks)
    cfg["checkpoint"] = {"every": CHECKPOINT_EVERY, "keep_last": 1, "resume": "auto",
                         "export_hf": False}
    job = {"cfg": cfg, "checks": list(checks), "eval": ev["valid"], "out": str(out)}
    if name != "adapted":                      # (the stage's own job keeps its digest)
        job["result"] = f"{name}.json"
    if stop_bpb is not None:
        job["stop_bpb"] = stop_bpb
    res_path = out / f"{name}.json"
    if not (res_path.exists() and json.loads(res_path.read_text()).get("digest")
            == distill._digest(job)):
        out.mkdir(parents=True, exist_ok=True)
        (out / "job.json").write_text(json.dumps(job))
        say(f"[teacher] adapting Gemma-3-270M on the domain ({folder}), checks at {list(checks)}")
        distill.stream([sys.executable, str(HERE / "distill_eval.py"), "adapt",
                        str(out / "job.json")], out / "adapt.log", "teacher", max(checks))
    return json.loads(res_path.read_text())["checks"]


def cosine_schedule(lr: float, steps: int) -> dict:
    """Amendment 4's schedule at peak rate ``lr``: ``WARMUP`` steps up (fewer only in a run too
    short for them: the plumbing check), cosine down to zero at step ``steps``."""
    return {"lr": lr, "kind": "cosine", "warmup_steps": min(WARMUP, max(1, steps // 6)),
            "min_lr_ratio": 0.0}


def candidate_folder(lr: float, steps: int) -> str:
    return f"teacher_a4/lr{lr:g}_s{steps}"


def pick_constant(checks: list[dict], target: float, scheme: str) -> tuple[dict, bool]:
    """The rule as first written / amendment 2: the first check at or below ``target``; else
    the last (``plays``) or the best-scoring check."""
    hit = [c for c in checks if c["bpb"] <= target]
    fallback = checks[-1] if scheme == "plays" else min(checks, key=lambda c: c["bpb"])
    return (hit[0] if hit else fallback), bool(hit)


def pick_cosine(results: list[dict], target: float) -> tuple[dict, bool]:
    """Amendment 4: the lowest validation bits per byte (ties: fewer steps, then lower rate)."""
    pick = min(results, key=lambda c: (c["bpb"], c["step"], c["lr"]))
    return pick, pick["bpb"] <= target


def run_candidates(args, ev: dict, data: dict) -> list[dict]:
    """Every candidate of ``args.candidates`` adapted (cached), its one check with its rate."""
    out = []
    for lr, steps in args.candidates:
        (check,) = adapt(args, ev, data, [steps], schedule=cosine_schedule(lr, steps),
                         folder=candidate_folder(lr, steps))
        out.append({**check, "lr": lr})
        say(f"[teacher] candidate lr {lr:g}, {steps} steps: validation bpb {check['bpb']:.4f}")
    return out


def stage(args, state: dict, ev: dict, data: dict, rule: str) -> dict:
    """Stage 2 by ``rule``; ``state["teacher"]`` (checks, target, chosen, lead, met)."""
    target = state["ce_lr"]["valid_bpb"] - LEAD
    if rule == "cosine":
        checks = run_candidates(args, ev, data)
        pick, met = pick_cosine(checks, target)
    else:
        checks = adapt(args, ev, data, args.checks, None if args.scheme == "plays" else target)
        pick, met = pick_constant(checks, target, args.scheme)
    state["teacher"] = {"rule": rule, "checks": checks, "target_bpb": target, "chosen": pick,
                        "lead": state["ce_lr"]["valid_bpb"] - pick["bpb"], "met": met}
    say(f"[study] teacher: {pick['step']} adaptation steps, validation bpb {pick['bpb']:.4f}, "
        f"lead {state['teacher']['lead']:.4f} over CE-only ({'met' if met else 'NOT met'})")
    return state["teacher"]


def ensure(args, state: dict, ev: dict, data: dict) -> None:
    """The chosen teacher's weights, rebuilt when its folder was lost (a new machine): the same
    adaptation up to the chosen step (a constant rate: the steps after it do not change it; a
    cosine candidate: the candidate again), which must score the recorded validation bits per
    byte again (``TOL``)."""
    pick = state["teacher"]["chosen"]
    if Path(pick["model"]).is_dir():
        return
    cosine = state["teacher"].get("rule") == "cosine"
    folder = Path(candidate_folder(pick["lr"], pick["step"]) if cosine else "teacher_v2")
    if Path(pick["model"]).parent != args.out / folder:
        raise SystemExit(f"[study] the records' teacher {pick['model']} is not under --out "
                         f"{args.out}: run the study with the --out it was recorded with")
    say(f"[study] the chosen teacher {pick['model']} is missing: rebuilding it")
    if cosine:
        checks = adapt(args, ev, data, [pick["step"]], name="rebuilt",
                       schedule=cosine_schedule(pick["lr"], pick["step"]), folder=str(folder))
    else:
        checks = adapt(args, ev, data, [c for c in args.checks if c <= pick["step"]],
                       name="rebuilt")
    again = next(c for c in checks if c["step"] == pick["step"])
    if abs(again["bpb"] - pick["bpb"]) > TOL or again["model"] != pick["model"]:
        raise SystemExit(f"[study] the rebuilt teacher scores {again['bpb']:.6f} bits/byte on "
                         f"validation at step {pick['step']}, the records say "
                         f"{pick['bpb']:.6f} (tolerance {TOL}): not the same teacher")
    say(f"[study] teacher rebuilt: validation bpb {again['bpb']:.6f} (recorded "
        f"{pick['bpb']:.6f})")
