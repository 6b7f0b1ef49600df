"""The real-model evidence protocol (``benchmarks/real/PROTOCOL.md``), stage by stage.

    .venv/bin/python benchmarks/real/study.py                                # amendment 4, every stage
    .venv/bin/python benchmarks/real/study.py --stage teacher
    .venv/bin/python benchmarks/real/study.py --scheme blocks                # amendment 2 (as run)
    .venv/bin/python benchmarks/real/study.py --scheme plays                 # as first written
    .venv/bin/python benchmarks/real/study.py --out /tmp/rs --smoke          # 2-step plumbing check

Stages (each one's choices go to ``<out>/study.json`` and the records' ``study.json``; every run
is cached by its configuration, so the study can span several sessions; ``all`` runs the stages
not recorded yet). On a new machine (an empty ``--out``) the recorded stages come from the
records, each finished run's result is restored from ``<records>/runs/`` (committed), and the
chosen teacher is rebuilt (the same adaptation, checked against its recorded score).

``--scheme`` picks the amendment (``AMENDMENTS``: texts, records, run folder, confirmation seeds,
the dtype every ``auto`` resolves to, the teacher and on-policy rules): ``blocks4`` (amendment 4,
the default; ``evidence/a4/``, ``runs/real_a4``) holds out blocks 4 and 14 (validation) and 1 and
11 (test) of the four domain plays; ``blocks`` (amendment 2; ``evidence/a2/``) blocks 4 and 14
and 9 and 19; ``plays`` (as first written; ``evidence/``) validates on *The Tempest* and tests on
*Twelfth Night*.

1. ``ce_lr``     CE-only at each rate of ``LR_GRID``, seeds 0-1, scored on validation; the best
                 mean validation bits per byte picks CE's rate.
2. ``teacher``   Gemma-3-270M adapted by CE on the domain (``teachers.py``): at a constant rate,
                 checked at each of ``ADAPT_CHECKS`` (amendments 0-2), or one cosine-decayed
                 adaptation per candidate of ``TEACHER_CANDIDATES`` (amendment 4); its lead over
                 CE-only is reported against ``teachers.LEAD``.
3. ``pkl_lr``    P-KL to that teacher at each rate of ``LR_GRID``, seeds 0-1, validation; picks
                 the distillation arms' rate (amendment 4: the student's samples of validation
                 prompts judged by the teacher too, for stage 3a's degeneration line).
4. ``op_lr``     on-policy k1 to that teacher (``onpolicy_arms.py``: prompts cut from the
                 student's slice, as many sampled student tokens as an off-policy arm trains on)
                 at each rate of ``LR_GRID``, seeds 0-1, validation; picks the on-policy arms' rate
                 by validation bits per byte (amendment 1) or, under amendment 4, by the teacher's
                 bits per byte on the student's samples of validation prompts, rates that
                 degenerate excluded (:func:`best_on_samples`).
5. ``smoothing`` CE + label smoothing at CE's rate, each eps of ``LS_GRID``, seeds 0-1.
6. ``confirm``   every arm of ``CONFIRM_ARMS`` on the amendment's fresh seeds, scored once on
                 the test split, plus the other play and the out-of-domain text and the student's
                 samples of test prompts judged by the teacher (``samples.py``) at the end; the
                 table (Welch and paired t, Holm over each family's comparisons) is generated from
                 the committed ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import distill  # this script's folder is on the path when it runs
import onpolicy_arms
import splits
import teachers

HERE = Path(__file__).resolve().parent

RECORDS = HERE / "evidence"
LR_GRID = (3e-5, 1e-4, 3e-4)
LS_GRID = (0.05, 0.1, 0.2)
ADAPT_CHECKS = (60, 120, 240, 480)
TEACHER_CANDIDATES = ((3e-5, 240), (1e-4, 240), (3e-5, 480), (1e-4, 480))  # amendment 4
TUNE_SEEDS = (0, 1)
CONFIRM_ARMS = ("ce", "ce_ls", "pkl", "pkl_stock", "self_kl", "multi", "alm",
                *onpolicy_arms.ONPOLICY_ARMS)
STAGES = ("ce_lr", "teacher", "pkl_lr", "op_lr", "smoothing", "confirm")
# what each stage's rule reads (PROTOCOL.md): label smoothing is tuned at CE-only's rate, so it
# needs stage 1 only and may run while the teacher stages wait; amendment 4's on-policy rule
# reads P-KL's repetition (stage 3)
NEEDS = {"ce_lr": (), "teacher": ("ce_lr",), "pkl_lr": ("ce_lr", "teacher"),
         "op_lr": ("ce_lr", "teacher"), "smoothing": ("ce_lr",), "confirm": STAGES[:-1]}
REPETITION_FLOOR = 0.02   # amendment 4: the degeneration line is max(2 x P-KL's, this)


@dataclass(frozen=True)
class Amendment:
    """What a ``--scheme`` runs (PROTOCOL.md)."""

    records: str                   # folder of the records under evidence/ ("" = evidence/)
    out: str                       # default run folder
    confirm_seeds: tuple[int, ...]  # the confirmation's fresh seeds
    auto_dtype: str                # what every ``auto`` dtype of the study's runs resolves to
    teacher: str                   # stage 2's rule (teachers.py): "constant" or "cosine"
    op_rule: str                   # stage 3a's measure: "text" (bpb) or "samples" (teacher's)


AMENDMENTS = {
    "plays": Amendment("", "runs/real_v2", (100, 101, 102, 103, 104), "float32", "constant",
                       "text"),
    "blocks": Amendment("a2", "runs/real_a2", (100, 101, 102, 103, 104), "float32",
                        "constant", "text"),
    "blocks4": Amendment("a4", "runs/real_a4", (110, 111, 112, 113, 114), "bfloat16",
                         "cosine", "samples"),
}
SAMPLE_PROMPTS, SAMPLE_SEED = 32, 4321   # test prompts the student continues (samples.py)
say = distill.say


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="run folder (default: the amendment's, e.g. runs/real_a4)")
    p.add_argument("--scheme", choices=tuple(AMENDMENTS), default="blocks4",
                   help="the amendment (texts: splits.py): held-out blocks of the domain plays "
                        "(blocks4: amendment 4; blocks: amendment 2) or other plays (plays: as "
                        "first written)")
    p.add_argument("--stage", choices=STAGES + ("all",), default="all")
    p.add_argument("--smoke", action="store_true",
                   help="2 steps, 2-step adaptation, 1 eval batch: checks the plumbing only")
    args = p.parse_args(argv)
    args.amendment = am = AMENDMENTS[args.scheme]
    if args.out is None:
        args.out = Path(am.out)
    base = distill.parse(["--steps", "60", "--eval-every", "20", "--eval-batches", "8",
                          "--agree-passages", "16", "--teacher-lr", "3e-5"])
    for k, v in vars(base).items():
        if not hasattr(args, k):          # --out is the study's own
            setattr(args, k, v)
    args.checks, args.candidates = ADAPT_CHECKS, TEACHER_CANDIDATES
    args.tune_seeds, args.confirm_seeds = TUNE_SEEDS, am.confirm_seeds
    if args.smoke:
        args.steps, args.eval_every, args.eval_batches, args.agree_passages = 2, 0, 1, 2
        args.checks, args.candidates = (1, 2), ((1e-4, 1), (3e-5, 2))
        args.tune_seeds, args.confirm_seeds = (0,), am.confirm_seeds[:1]
    args.lr_grid, args.ls_grid = ((1e-4,), (0.1,)) if args.smoke else (LR_GRID, LS_GRID)
    args.sample_prompts = 2 if args.smoke else SAMPLE_PROMPTS
    args.records = RECORDS / am.records if not args.smoke else args.out / "evidence"
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
    per seed (and, for runs with samples, the teacher's bits per byte on them and their
    repetition); raw runs kept under ``<out>/<stage>/<key><value>``."""
    table = {}
    for v in values:
        root = args.out / stage / f"{key}{v:g}"
        runs = {s: run(arm, s, args, {**a, key: v, "eval": ev}, root) for s in seeds}
        bpbs = [r["curve"][-1]["bpb"] for r in runs.values()]
        table[f"{v:g}"] = {"bpb": bpbs, "mean": statistics.fmean(bpbs), "runs": runs}
        if all("samples" in r for r in runs.values()):
            for name in ("teacher_bpb_on_samples", "repetition"):
                table[f"{v:g}"][name] = statistics.fmean(r["samples"][name]
                                                         for r in runs.values())
    return table


def best(table: dict) -> float:
    """The grid value with the lowest mean validation bits per byte (ties: the smaller value)."""
    return min((float(k) for k in table), key=lambda v: (table[f"{v:g}"]["mean"], v))


def degeneration_line(pkl_repetition: float) -> float:
    """Amendment 4: a repetition above this on validation samples is degeneration."""
    return max(2 * pkl_repetition, REPETITION_FLOOR)


def best_on_samples(table: dict, line: float) -> float:
    """Amendment 4's on-policy rate: among the values whose mean repetition on the validation
    samples is at most ``line``, the lowest mean teacher bits per byte on those samples (ties:
    the smaller value); when every value degenerates, the smallest."""
    values = sorted(float(k) for k in table)
    ok = [v for v in values if table[f"{v:g}"]["repetition"] <= line]
    if not ok:
        return values[0]
    return min(ok, key=lambda v: (table[f"{v:g}"]["teacher_bpb_on_samples"], v))


def save(args, state: dict, name: str, raw) -> None:
    args.records.mkdir(parents=True, exist_ok=True)
    (args.records / f"{name}.json").write_text(json.dumps(raw, indent=1))
    for folder in (args.out, args.records):
        (folder / "study.json").write_text(json.dumps(state, indent=1))


def tune(args, state, stage: str, arm: str, a: dict, values, key: str, ev: dict,
         choose=best) -> float:
    """One tuning stage: ``arm`` over ``values`` of ``key`` on validation, the value ``choose``
    picks from the grid recorded in ``state[stage]`` with its grid, the raw runs saved."""
    table = grid(args, a, arm, values, key, args.tune_seeds, ev["valid"], stage)
    chosen = choose(table)
    state[stage] = {"chosen": chosen, "valid_bpb": table[f"{chosen:g}"]["mean"],
                    "grid": {k: {n: x for n, x in v.items() if n != "runs"}
                             for k, v in table.items()}}
    save(args, state, stage, table)
    say(f"[study] {stage}: {key} {chosen:g} (validation bpb {state[stage]['valid_bpb']:.4f})")
    return chosen


def sample_spec(args, teacher: str, texts: list[str]) -> dict:
    """The student's samples of the first prompts of ``texts``, judged by ``teacher``."""
    return {"prompts": onpolicy_arms.prompts(texts, args.sample_prompts),
            "new_tokens": onpolicy_arms.NEW_TOKENS, "seed": SAMPLE_SEED, "teacher": teacher,
            "teacher_add_bos": True}


def tuning_samples(args, state, data: dict) -> dict:
    """Amendment 4's tuning runs of stages 3 and 3a also sample validation prompts."""
    if args.amendment.op_rule != "samples":
        return {}
    return {"samples": sample_spec(args, state["teacher"]["chosen"]["model"],
                                   data["valid_texts"])}


def stage_ce_lr(args, state, a, ev) -> None:
    tune(args, state, "ce_lr", "ce", a, args.lr_grid, "lr", ev)


def stage_teacher(args, state, a, ev, data) -> None:
    teacher = teachers.stage(args, state, ev, data, args.amendment.teacher)
    save(args, state, "teacher", teacher["checks"])


def stage_pkl_lr(args, state, a, ev, data) -> None:
    a = {**a, "teacher": state["teacher"]["chosen"]["model"],
         **tuning_samples(args, state, data)}
    tune(args, state, "pkl_lr", "pkl", a, args.lr_grid, "lr", ev)


def onpolicy_assets(args, state, a: dict, data: dict) -> dict:
    """``a`` with the chosen teacher and the prompts file cut from the student's slice."""
    path = onpolicy_arms.write_prompts(data["slice_texts"], args.out / "prompts_slice.jsonl")
    return {**a, "teacher": state["teacher"]["chosen"]["model"], "prompts": path}


def stage_op_lr(args, state, a, ev, data) -> None:
    a = {**onpolicy_assets(args, state, a, data), **tuning_samples(args, state, data)}
    if args.amendment.op_rule != "samples":
        tune(args, state, "op_lr", "op_k1", a, args.lr_grid, "lr", ev)
        return
    pkl = state["pkl_lr"]["grid"][f"{state['pkl_lr']['chosen']:g}"]
    line = degeneration_line(pkl["repetition"])
    chosen = tune(args, state, "op_lr", "op_k1", a, args.lr_grid, "lr", ev,
                  lambda table: best_on_samples(table, line))
    state["op_lr"]["degeneration_line"] = line
    save(args, state, "op_lr_rule", {"line": line, "pkl_repetition": pkl["repetition"],
                                     "chosen": chosen})
    say(f"[study] op_lr by the teacher's bits per byte on validation samples: lr {chosen:g} "
        f"(repetition line {line:.3f})")


def stage_smoothing(args, state, a, ev) -> None:
    a = {**a, "lr": state["ce_lr"]["chosen"]}
    tune(args, state, "smoothing", "ce_ls", a, args.ls_grid, "label_smoothing", ev)


def stage_confirm(args, state, a, ev, data) -> None:
    from distill_report import write_report

    samples = sample_spec(args, state["teacher"]["chosen"]["model"], data["test_texts"])
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
            "args": vars(args) | {"out": str(args.out), "records": str(args.records),
                                  "amendment": asdict(args.amendment)},
            "study": state, "wall_s": sum(r["seconds"] for arm in results.values()
                                          for r in arm.values()),
            "data_text": data_text(args, data), "start": start,
            "vs_pkl_on_samples": args.amendment.op_rule == "samples"}   # amendment 4
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
        valid, test = splits.HELD_OUT[data["scheme"]]
        held = (f"decisions on blocks {valid} of {splits.BLOCKS} of every domain "
                f"play ({data['valid_kb']:.0f} KB), this table on blocks {test} "
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


def pin_auto_dtype(dtype: str) -> None:
    """Every ``auto`` dtype of the study's runs (teachers and students) resolves to ``dtype``
    (the amendment's), in this process and the runs it starts: amendments 0-2 were recorded
    where ``auto`` meant float32, and a machine whose CPU now gets bfloat16 under ``auto`` must
    still compute the same study (the rebuilt teacher's check, comparable stages); amendment 4
    runs in bfloat16 mixed precision on every machine. An explicit ``XDISTILL_AUTO_DTYPE`` wins."""
    from xdistill.precision import ENV_OVERRIDE  # deferred: the package, after the path is set

    if os.environ.setdefault(ENV_OVERRIDE, dtype) != dtype:
        say(f"[study] {ENV_OVERRIDE}={os.environ[ENV_OVERRIDE]}: not the protocol's {dtype}")


def needs(args, name: str) -> tuple[str, ...]:
    """The stages ``name``'s rule reads (``NEEDS``; amendment 4's on-policy rule reads P-KL's)."""
    extra = ("pkl_lr",) if name == "op_lr" and args.amendment.op_rule == "samples" else ()
    return NEEDS[name] + extra


def main(argv=None) -> int:
    args = parse(argv)
    pin_auto_dtype(args.amendment.auto_dtype)
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
        missing = [s for s in needs(args, name) if s not in state]
        if missing:
            raise SystemExit(f"[study] stage {name!r} needs {', '.join(missing)} first")
        if name in ("pkl_lr", "op_lr", "confirm"):
            teachers.ensure(args, state, ev, data)
        extra = (data,) if name in ("teacher", "pkl_lr", "op_lr", "confirm") else ()
        globals()[f"stage_{name}"](args, state, a, ev, *extra)
    say(f"[study] done in {(time.perf_counter() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
