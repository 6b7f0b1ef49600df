"""The real-model evidence protocol (``benchmarks/real/PROTOCOL.md``), stage by stage.

    .venv/bin/python benchmarks/real/study.py --out runs/real_a2             # every stage in order
    .venv/bin/python benchmarks/real/study.py --out runs/real_a2 --stage teacher
    .venv/bin/python benchmarks/real/study.py --out runs/real_v2 --scheme plays   # as first written
    .venv/bin/python benchmarks/real/study.py --out /tmp/rs --smoke          # 2-step plumbing check

Stages (each one's choices go to ``<out>/study.json`` and ``evidence/study.json``; every run is
cached by its configuration, so the study can span several sessions; ``all`` runs the stages not
recorded yet). On a new machine (an empty ``--out``) the recorded stages come from the records,
each finished run's result is restored from ``<records>/runs/`` (committed), and the chosen
teacher is rebuilt (the same adaptation up to its step, checked against its recorded score).
The texts follow ``--scheme`` (``splits.py``): ``blocks`` (amendment 2, the default; records in
``evidence/a2/``) holds out blocks of the four domain plays for validation and test; ``plays``
(as first written; records in ``evidence/``) validates on *The Tempest* and tests on *Twelfth
Night*.

1. ``ce_lr``     CE-only at each rate of ``LR_GRID``, seeds 0-1, scored on validation; the best
                 mean validation bits per byte picks CE's rate.
2. ``teacher``   Gemma-3-270M adapted by CE on the domain at a constant rate, scored on
                 validation and exported at each of ``ADAPT_CHECKS``; the teacher is the first
                 that leads CE-only's validation bits per byte by >= ``LEAD``, and the adaptation
                 stops there (``blocks``); if none does, the best-scoring check (``blocks``; the
                 last one under ``plays``), the shortfall reported.
3. ``pkl_lr``    P-KL to that teacher at each rate of ``LR_GRID``, seeds 0-1, validation; picks
                 the distillation arms' rate.
4. ``op_lr``     on-policy k1 to that teacher (``onpolicy_arms.py``: prompts cut from the
                 student's slice, as many sampled student tokens as an off-policy arm trains on)
                 at each rate of ``LR_GRID``, seeds 0-1, validation; picks the on-policy arms' rate
                 (PROTOCOL.md, amendment 1).
5. ``smoothing`` CE + label smoothing at CE's rate, each eps of ``LS_GRID``, seeds 0-1.
6. ``confirm``   every arm of ``CONFIRM_ARMS``, seeds 100-104 (never used before), scored once on
                 the test split, plus the other play and the out-of-domain text and the student's
                 samples of test prompts judged by the teacher (``samples.py``) at the end; the
                 table (Welch and paired t, Holm over each family's comparisons) is generated from
                 the committed ``evidence/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import distill  # this script's folder is on the path when it runs
import onpolicy_arms
import splits

HERE = Path(__file__).resolve().parent

RECORDS = HERE / "evidence"
LR_GRID = (3e-5, 1e-4, 3e-4)
LS_GRID = (0.05, 0.1, 0.2)
ADAPT_CHECKS = (60, 120, 240, 480)
ADAPT_CHECKPOINT_EVERY = 30   # adaptation steps between checkpoints (~4 min each here)
LEAD = 0.15
TEACHER_TOL = 2e-3       # bits/byte: a rebuilt teacher must score its recorded validation figure
AMENDMENT = "a2"         # the blocks scheme's records: evidence/a2/, runs/real_a2
TUNE_SEEDS = (0, 1)
CONFIRM_SEEDS = (100, 101, 102, 103, 104)
CONFIRM_ARMS = ("ce", "ce_ls", "pkl", "pkl_stock", "self_kl", "multi", "alm",
                *onpolicy_arms.ONPOLICY_ARMS)
STAGES = ("ce_lr", "teacher", "pkl_lr", "op_lr", "smoothing", "confirm")
# what each stage's rule reads (PROTOCOL.md): label smoothing is tuned at CE-only's rate, so it
# needs stage 1 only and may run while the teacher stages wait
NEEDS = {"ce_lr": (), "teacher": ("ce_lr",), "pkl_lr": ("ce_lr", "teacher"),
         "op_lr": ("ce_lr", "teacher"), "smoothing": ("ce_lr",), "confirm": STAGES[:-1]}
SAMPLE_PROMPTS, SAMPLE_SEED = 32, 4321   # test prompts the student continues (samples.py)
say = distill.say


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="run folder (default runs/real_a2, or runs/real_v2 with --scheme plays)")
    p.add_argument("--scheme", choices=splits.SCHEMES, default="blocks",
                   help="texts (splits.py): held-out blocks of the domain plays (amendment 2) or "
                        "other plays (as first written)")
    p.add_argument("--stage", choices=STAGES + ("all",), default="all")
    p.add_argument("--smoke", action="store_true",
                   help="2 steps, 2-step adaptation, 1 eval batch: checks the plumbing only")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = Path("runs/real_v2" if args.scheme == "plays" else f"runs/real_{AMENDMENT}")
    base = distill.parse(["--steps", "60", "--eval-every", "20", "--eval-batches", "8",
                          "--agree-passages", "16", "--teacher-lr", "3e-5"])
    for k, v in vars(base).items():
        if not hasattr(args, k):          # --out is the study's own
            setattr(args, k, v)
    args.checks, args.tune_seeds, args.confirm_seeds = ADAPT_CHECKS, TUNE_SEEDS, CONFIRM_SEEDS
    if args.smoke:
        args.steps, args.eval_every, args.eval_batches, args.agree_passages = 2, 0, 1, 2
        args.checks, args.tune_seeds, args.confirm_seeds = (1, 2), (0,), (100,)
    args.lr_grid, args.ls_grid = ((1e-4,), (0.1,)) if args.smoke else (LR_GRID, LS_GRID)
    args.sample_prompts = 2 if args.smoke else SAMPLE_PROMPTS
    records = RECORDS if args.scheme == "plays" else RECORDS / AMENDMENT
    args.records = records if not args.smoke else args.out / "evidence"
    return args


def evals(args, data: dict) -> dict:
    ev = lambda split: {"paths": [data[split]], "batches": args.eval_batches,  # noqa: E731
                        "texts": data[f"{split}_texts"][:args.agree_passages]}
    out = {"valid": ev("valid"), "test": ev("test")}
    for name in ("other_play", "ood"):              # reported, not tested
        if name in data:
            out[name] = {"paths": [data[name]], "batches": args.eval_batches, "texts": []}
    return out


def base_assets(args, data: dict) -> dict:
    from xdistill.assets import model_dir

    return {"student": str(model_dir("smollm2-135m")), "stock_teacher": str(model_dir("gemma3-270m")),
            "slice": data["slice"], "proj": distill.build_projection_file(args.out),
            "teacher": str(model_dir("gemma3-270m")), "teacher_preds": None}


def run(arm: str, seed: int, args, a: dict, root: Path) -> dict:
    """:func:`distill.run_arm`, with each finished run's ``result.json`` also kept in the
    records (``<records>/runs/<stage>/<arm>_seed<k>.json``, committed), and restored from there
    when the run folder was lost (a new machine): ``run_arm`` still checks its digest, so a
    restored result counts only for the identical job."""
    rel = root.relative_to(args.out) if root.is_relative_to(args.out) else Path(root.name)
    kept = args.records / "runs" / rel / f"{arm}_seed{seed}.json"
    result = root / "runs" / arm / f"seed{seed}" / "result.json"
    if kept.exists() and not result.exists():
        result.parent.mkdir(parents=True, exist_ok=True)
        result.write_text(kept.read_text())
    res = distill.run_arm(arm, seed, args, a, root)
    text = result.read_text()
    if not kept.exists() or kept.read_text() != text:        # a new or retrained run only
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(text)
    return res


def grid(args, a: dict, arm: str, values, key: str, seeds, ev: dict, stage: str) -> dict:
    """``arm`` at each value of ``key`` (``lr`` or ``label_smoothing``), validation bits per byte
    per seed; raw runs kept under ``<out>/<stage>/<key><value>``."""
    table = {}
    for v in values:
        root = args.out / stage / f"{key}{v:g}"
        runs = {s: run(arm, s, args, {**a, key: v, "eval": ev}, root) for s in seeds}
        bpbs = [r["curve"][-1]["bpb"] for r in runs.values()]
        table[f"{v:g}"] = {"bpb": bpbs, "mean": statistics.fmean(bpbs), "runs": runs}
    return table


def best(table: dict) -> float:
    """The grid value with the lowest mean validation bits per byte (ties: the smaller value)."""
    return min((float(k) for k in table), key=lambda v: (table[f"{v:g}"]["mean"], v))


def save(args, state: dict, name: str, raw) -> None:
    args.records.mkdir(parents=True, exist_ok=True)
    (args.records / f"{name}.json").write_text(json.dumps(raw, indent=1))
    for folder in (args.out, args.records):
        (folder / "study.json").write_text(json.dumps(state, indent=1))


def tune(args, state, stage: str, arm: str, a: dict, values, key: str, ev: dict) -> float:
    """One tuning stage: ``arm`` over ``values`` of ``key`` on validation, the best value (by
    :func:`best`) recorded in ``state[stage]`` with its grid, the raw runs saved."""
    table = grid(args, a, arm, values, key, args.tune_seeds, ev["valid"], stage)
    chosen = best(table)
    state[stage] = {"chosen": chosen, "valid_bpb": table[f"{chosen:g}"]["mean"],
                    "grid": {k: {"bpb": v["bpb"], "mean": v["mean"]} for k, v in table.items()}}
    save(args, state, stage, table)
    say(f"[study] {stage}: {key} {chosen:g} (validation bpb {state[stage]['valid_bpb']:.4f})")
    return chosen


def stage_ce_lr(args, state, a, ev) -> None:
    tune(args, state, "ce_lr", "ce", a, args.lr_grid, "lr", ev)


def adapt_teacher(args, ev, data, checks, stop_bpb=None, name: str = "adapted") -> list[dict]:
    """Gemma-3-270M adapted by CE on the domain (constant rate), scored on validation and
    exported at each of ``checks`` under ``<out>/teacher_v2`` (resumable; cached by its job in
    ``<name>.json``); its checks."""
    out = args.out / "teacher_v2"
    cfg = distill.teacher_config(args, {"domain": data["domain"]}, out)
    cfg["scheduler"] = {"kind": "constant", "warmup_steps": max(1, args.checks[0] // 6)}
    cfg["train"]["steps"] = max(checks)
    # resumable (distill_eval.adapt): a killed adaptation restarts from its last checkpoint
    cfg["checkpoint"] = {"every": ADAPT_CHECKPOINT_EVERY, "keep_last": 1, "resume": "auto",
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
        say(f"[teacher] adapting Gemma-3-270M on the domain, checks at {list(checks)}")
        distill.stream([sys.executable, str(HERE / "distill_eval.py"), "adapt",
                        str(out / "job.json")], out / "adapt.log", "teacher", max(checks))
    return json.loads(res_path.read_text())["checks"]


def stage_teacher(args, state, a, ev, data) -> None:
    target = state["ce_lr"]["valid_bpb"] - LEAD
    checks = adapt_teacher(args, ev, data, args.checks,
                           None if args.scheme == "plays" else target)   # amendment 2: stop
    hit = [c for c in checks if c["bpb"] <= target]
    fallback = checks[-1] if args.scheme == "plays" else min(checks, key=lambda c: c["bpb"])
    pick = hit[0] if hit else fallback
    state["teacher"] = {"checks": checks, "target_bpb": target, "chosen": pick,
                        "lead": state["ce_lr"]["valid_bpb"] - pick["bpb"], "met": bool(hit)}
    save(args, state, "teacher", checks)
    say(f"[study] teacher: {pick['step']} adaptation steps, validation bpb {pick['bpb']:.4f}, "
        f"lead {state['teacher']['lead']:.4f} over CE-only ({'met' if hit else 'NOT met'})")


def ensure_teacher(args, state, ev, data) -> None:
    """The chosen teacher's weights, rebuilt when its folder was lost (a new machine): the same
    adaptation up to the chosen step (a constant rate: the steps after it do not change it),
    which must score the recorded validation bits per byte again (``TEACHER_TOL``)."""
    pick = state["teacher"]["chosen"]
    if Path(pick["model"]).is_dir():
        return
    if Path(pick["model"]).parent != args.out / "teacher_v2":
        raise SystemExit(f"[study] the records' teacher {pick['model']} is not under --out "
                         f"{args.out}: run the study with the --out it was recorded with")
    say(f"[study] the chosen teacher {pick['model']} is missing: rebuilding it")
    checks = adapt_teacher(args, ev, data, [c for c in args.checks if c <= pick["step"]],
                           name="rebuilt")
    again = next(c for c in checks if c["step"] == pick["step"])
    if abs(again["bpb"] - pick["bpb"]) > TEACHER_TOL or again["model"] != pick["model"]:
        raise SystemExit(f"[study] the rebuilt teacher scores {again['bpb']:.6f} bits/byte on "
                         f"validation at step {pick['step']}, the records say "
                         f"{pick['bpb']:.6f} (tolerance {TEACHER_TOL}): not the same teacher")
    say(f"[study] teacher rebuilt: validation bpb {again['bpb']:.6f} (recorded "
        f"{pick['bpb']:.6f})")


def stage_pkl_lr(args, state, a, ev) -> None:
    a = {**a, "teacher": state["teacher"]["chosen"]["model"]}
    tune(args, state, "pkl_lr", "pkl", a, args.lr_grid, "lr", ev)


def onpolicy_assets(args, state, a: dict, data: dict) -> dict:
    """``a`` with the chosen teacher and the prompts file cut from the student's slice."""
    path = onpolicy_arms.write_prompts(data["slice_texts"], args.out / "prompts_slice.jsonl")
    return {**a, "teacher": state["teacher"]["chosen"]["model"], "prompts": path}


def stage_op_lr(args, state, a, ev, data) -> None:
    tune(args, state, "op_lr", "op_k1", onpolicy_assets(args, state, a, data), args.lr_grid,
         "lr", ev)


def stage_smoothing(args, state, a, ev) -> None:
    a = {**a, "lr": state["ce_lr"]["chosen"]}
    tune(args, state, "smoothing", "ce_ls", a, args.ls_grid, "label_smoothing", ev)


def stage_confirm(args, state, a, ev, data) -> None:
    from distill_report import write_report

    teacher = state["teacher"]["chosen"]["model"]
    samples = {"prompts": onpolicy_arms.prompts(data["test_texts"], args.sample_prompts),
               "new_tokens": onpolicy_arms.NEW_TOKENS, "seed": SAMPLE_SEED, "teacher": teacher,
               "teacher_add_bos": True}
    a = {**onpolicy_assets(args, state, a, data), "label_smoothing":
         state["smoothing"]["chosen"], "eval": ev["test"],
         "final_evals": {k: ev[k] for k in ("other_play", "ood") if k in ev},
         "samples": samples}
    (args.out / "confirm").mkdir(parents=True, exist_ok=True)
    start = distill.starting_figures(args, a, args.out / "confirm")   # on the test split
    a["teacher_preds"] = start["preds"]
    stage_of = lambda arm: ("ce_lr" if arm in ("ce", "ce_ls") else  # noqa: E731
                            "op_lr" if arm in onpolicy_arms.ONPOLICY_ARMS else "pkl_lr")
    rates = {arm: state[stage_of(arm)]["chosen"] for arm in CONFIRM_ARMS}
    results = {arm: {} for arm in CONFIRM_ARMS}
    for seed in args.confirm_seeds:
        for arm in CONFIRM_ARMS:
            results[arm][seed] = run(arm, seed, args, {**a, "lr": rates[arm]},
                                     args.out / "confirm")
    meta = {"command": "python benchmarks/real/study.py --stage confirm", "rates": rates,
            "hardware": hardware(), "protocol": "benchmarks/real/PROTOCOL.md",
            "data": {k: v for k, v in data.items() if k.endswith(("_kb", "_sha256"))},
            "args": vars(args) | {"out": str(args.out), "records": str(args.records)},
            "study": state, "wall_s": sum(r["seconds"] for arm in results.values()
                                          for r in arm.values()),
            "data_text": data_text(args, data), "start": start}
    write_report(results, meta, args.records)
    state["confirm"] = {"arms": list(CONFIRM_ARMS), "seeds": list(args.confirm_seeds),
                        "rates": rates}
    save(args, state, "confirm_state", state["confirm"])


def hardware() -> str:
    import os
    import platform

    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 platform.processor() or platform.machine()) if Path("/proc/cpuinfo").exists() \
        else platform.machine()
    return f"{model}, {os.cpu_count()} cores, no GPU"


def data_text(args, data: dict) -> str:
    if data["scheme"] == "plays":
        held = (f"decisions on *{splits.VALID}*, this table on the test play *{splits.TEST}* "
                f"({data['test_kb']:.0f} KB")
    else:
        held = (f"decisions on blocks {splits.VALID_BLOCKS} of {splits.BLOCKS} of every domain "
                f"play ({data['valid_kb']:.0f} KB), this table on blocks {splits.TEST_BLOCKS} "
                f"({data['test_kb']:.0f} KB, never seen by the teacher or the student), the other "
                f"play *{splits.TEST}* reported ({data['other_play_kb']:.0f} KB")
    return (f"Data: domain {data['domain_kb']:.0f} KB ({', '.join(splits.DOMAIN)}), student slice "
            f"{data['slice_kb']:.0f} KB; {held}; bits per byte on its first "
            f"{args.eval_batches} x 4 x 128 tokens, agreement on its first {args.agree_passages} "
            f"passages) and out-of-domain text (Python's reference topics, {data['ood_kb']:.0f} KB, "
            f"sha256 {data['ood_sha256']}). Student: {args.steps} steps of {args.batch} x "
            f"{args.seq_len} tokens, cosine.")


def load_state(args) -> dict:
    """The stages done so far: ``<out>/study.json``, or, in a new run folder (a new machine),
    the committed records' ``study.json``."""
    path, kept = args.out / "study.json", args.records / "study.json"
    if path.exists():
        return json.loads(path.read_text())
    if not kept.exists():
        return {}
    state = json.loads(kept.read_text())
    say(f"[study] {path} is new: the recorded stages come from {kept} ({', '.join(state)})")
    return state


def pin_float32() -> None:
    """Every ``auto`` dtype of the study's runs (teachers and students) resolves to float32, in
    this process and the runs it starts: stages 1-3 were recorded where ``auto`` meant float32,
    and a machine whose CPU now gets bfloat16 under ``auto`` must still compute the same study
    (the rebuilt teacher's check, comparable stages). An explicit ``XDISTILL_AUTO_DTYPE`` wins."""
    from xdistill.precision import ENV_OVERRIDE  # deferred: the package, after the path is set

    if os.environ.setdefault(ENV_OVERRIDE, "float32") != "float32":
        say(f"[study] {ENV_OVERRIDE}={os.environ[ENV_OVERRIDE]}: not the recorded float32")


def main(argv=None) -> int:
    args = parse(argv)
    pin_float32()
    args.out.mkdir(parents=True, exist_ok=True)
    state = load_state(args)
    t0 = time.perf_counter()
    data = splits.prepare_splits(args.out, args.slice_kb, args.scheme)
    say("[data] " + ", ".join(f"{k} {data[f'{k}_kb']:.0f} KB" for k in splits.SPLITS[args.scheme]))
    ev, a = evals(args, data), base_assets(args, data)
    names = [n for n in STAGES if n not in state] if args.stage == "all" else [args.stage]
    if args.stage == "all" and len(names) < len(STAGES):
        say(f"[study] recorded already: {', '.join(n for n in STAGES if n in state)} "
            f"(--stage NAME runs one again, from its cached runs)")
    for name in names:
        missing = [s for s in NEEDS[name] if s not in state]
        if missing:
            raise SystemExit(f"[study] stage {name!r} needs {', '.join(missing)} first")
        if name in ("pkl_lr", "op_lr", "confirm"):
            ensure_teacher(args, state, ev, data)
        extra = (data,) if name in ("teacher", "op_lr", "confirm") else ()
        globals()[f"stage_{name}"](args, state, a, ev, *extra)
    say(f"[study] done in {(time.perf_counter() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
