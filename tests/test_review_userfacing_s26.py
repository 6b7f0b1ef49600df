"""Review (s26) of what users touch first: ``tools/``, ``examples/``, ``configs/``, ``Makefile``
and the README's commands.

Checked and found correct (no test here): every shipped YAML loads with the strict loader, and the
two GPU recipes also pass ``validate_offpolicy`` / ``validate_onpolicy`` once their absolute
paths point at folders that exist; the config headers' commands; every ``xdistill <sub> --help``
option the README names; ``pyproject.toml``'s console script, package data and markers; the
Makefile's ``test-vllm`` files; the README's inline ``tokenizers inspect`` / ``compare``.

Defects, one failing test each (all offline, a few seconds each; nothing is trained and nothing
is written outside ``tmp_path``):

1. ``test_gpu_check_unknown_part_is_an_error_not_all_passed``
2. ``test_gpu_check_out_that_is_a_file_is_one_line_error``
3. ``test_served_teacher_benchmark_skips_without_vllm_as_make_bench_needs``
4. ``test_offpolicy_example_plots_the_run_it_trained``
5. ``test_offpolicy_example_with_several_ranks_uses_its_own_out_dir``
6. ``test_cli_trainer_can_start_a_ray_teacher_as_the_gpu_onpolicy_recipe_needs``
7. ``test_fetch_assets_dir_that_is_a_file_is_one_line_error``
8. ``test_make_tiny_models_out_that_is_a_file_is_one_line_error``
9. ``test_readme_tree_rejects_an_unknown_option``
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def _run(argv, timeout=120, **env) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def test_gpu_check_unknown_part_is_an_error_not_all_passed(tmp_path):
    """tools/gpu_check.py ``--parts`` with a name that is not a part (a typo, ``--parts test``,
    or ``--parts "env, tests"`` with a space) runs nothing.

    Expected: exit 2 with one line naming the unknown part and the known ones (as
    ``benchmarks/gpu_step.py`` does for ``--variants``).
    Actual: ``[gpu_check] done in 0 s: all parts passed; <out>/gpu_check.md``, exit 0, and that
    gpu_check.md is never written (``check`` computes ``all(...)`` over an empty dict). On a GPU
    lease, whose minutes are counted, a typo reads as a passed check.
    Fix: in ``main``, ``bad = set(args.parts.split(",")) - set(PARTS)`` -> ``ap.error(...)``; and
    have ``check`` fail when no part ran."""
    out = tmp_path / "out"
    proc = _run([sys.executable, "tools/gpu_check.py", "--parts", "test", "--out", str(out)],
                timeout=60)
    assert "all parts passed" not in proc.stdout, proc.stdout
    assert proc.returncode != 0 and "test" in proc.stderr, (proc.returncode, proc.stderr)


def test_gpu_check_out_that_is_a_file_is_one_line_error(tmp_path):
    """tools/gpu_check.py ``--out`` naming an existing file.

    Expected: one line ``gpu_check: ... is a file`` and a non-zero exit (the script's other bad
    inputs, e.g. a missing ``--bundle``, end with one ``gpu_check: ...`` line).
    Actual: a ``FileExistsError`` traceback from ``out.mkdir`` in ``check``.
    Fix: check ``out.exists() and not out.is_dir()`` first and ``raise SystemExit(...)``."""
    target = tmp_path / "results"
    target.write_text("not a folder\n")
    proc = _run([sys.executable, "tools/gpu_check.py", "--parts", "env", "--out", str(target)],
                timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vllm is installed here: the script would start a real server")
def test_served_teacher_benchmark_skips_without_vllm_as_make_bench_needs():
    """``make bench`` runs every ``benchmarks/*.py`` with ``.venv/bin/python`` and stops at the
    first failure (``|| exit 1``). ``.venv`` has no vLLM (it lives in ``.venv-vllm``), and the
    other vLLM benchmarks (``onpolicy_engines.py``, ``rollout_engines.py``) print
    ``skipped: vllm is not installed here`` and exit 0 for exactly that reason.

    Expected: ``benchmarks/served_teacher.py`` skips the same way (exit 0, one line).
    Actual: it starts ``python -m vllm.entrypoints.openai.api_server``, which exits at once, and
    dies with a ``TeacherError`` traceback (exit 1): ``make bench`` fails there and never runs
    ``tokenization.py``, ``train_step.py`` and ``transport.py`` after it.
    Fix: the same ``importlib.util.find_spec("vllm") is None`` guard when no ``--url`` is given."""
    proc = _run([sys.executable, "benchmarks/served_teacher.py", "--rounds", "1"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
    assert "skipped" in proc.stdout + proc.stderr


def _stub_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for ``$PY`` that only records its arguments (nothing runs, nothing is written
    under the repository)."""
    log = tmp_path / "calls.log"
    stub = tmp_path / "py_stub"
    stub.write_text("#!/bin/sh\nprintf '%s\\n' \"$*\" >> \"$STUB_LOG\"\n")
    stub.chmod(0o755)
    return stub, log


def test_offpolicy_example_plots_the_run_it_trained(tmp_path):
    """examples/offpolicy_tiny_cpu.sh passes its arguments to the trainer as overrides
    (``"$@"``, as examples/onpolicy_tiny.sh documents: "Extra args are overrides"), but then plots
    ``runs/offpolicy_tiny_cpu/metrics.jsonl`` and announces ``runs/offpolicy_tiny_cpu/export``
    whatever ``train.out_dir`` was given.

    Expected: with ``train.out_dir=D`` the script plots ``D/metrics.jsonl`` (into ``D``).
    Actual: it plots the default folder: a one-line "does not exist" error after a successful
    run (exit 1 under ``set -e``), or, worse, the curves of an older run there.
    Fix: take the out dir from the overrides (or ask ``xdistill config show``), e.g. parse
    ``train.out_dir=*`` from ``"$@"`` with ``runs/offpolicy_tiny_cpu`` as the default."""
    stub, log = _stub_python(tmp_path)
    out_dir = tmp_path / "my_run"
    proc = subprocess.run(["bash", str(ROOT / "examples" / "offpolicy_tiny_cpu.sh"),
                           f"train.out_dir={out_dir}"], cwd=tmp_path,
                          env=_env(PY=str(stub), STUB_LOG=str(log)), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    plot = [c for c in calls if " plot " in f" {c} "]
    assert len(plot) == 1, calls
    assert f"{out_dir}/metrics.jsonl" in plot[0], plot[0]


def test_offpolicy_example_with_several_ranks_uses_its_own_out_dir(tmp_path):
    """configs/offpolicy_tiny_cpu.yaml's header and the README launch 2 ranks with
    ``train.out_dir=runs/tiny_2ranks``: "its own out_dir: a 1-process checkpoint cannot resume on
    2 ranks" (``checkpoint.resume: auto`` + ``strict_world_size`` -> CheckpointError).

    Expected: ``NPROC=2 examples/offpolicy_tiny_cpu.sh`` gives the torchrun run an out_dir of its
    own (not ``runs/offpolicy_tiny_cpu``, the 1-process run's).
    Actual: the torchrun line carries no ``train.out_dir``, so after the plain
    ``examples/offpolicy_tiny_cpu.sh`` (or the README's 1-process command) the 2-rank run stops
    with "checkpoint ... was written by 1 rank(s) but this run has 2".
    Fix: append ``train.out_dir=runs/tiny_2ranks`` (before ``"$@"``) to the NPROC > 1 branch and
    plot/echo that folder."""
    stub, log = _stub_python(tmp_path)
    proc = subprocess.run(["bash", str(ROOT / "examples" / "offpolicy_tiny_cpu.sh")],
                          cwd=tmp_path, env=_env(PY=str(stub), STUB_LOG=str(log), NPROC="2"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    runs = [c.split() for c in log.read_text().splitlines() if "torch.distributed.run" in c]
    assert len(runs) == 1, log.read_text()
    out_dirs = [a.split("=", 1)[1] for a in runs[0] if a.startswith("train.out_dir=")]
    assert out_dirs and out_dirs[-1].rstrip("/") != "runs/offpolicy_tiny_cpu", runs[0]


RAY_CHILD = textwrap.dedent("""
    import sys, types
    class RayInitCalled(Exception):
        pass
    def init(*args, **kwargs):
        raise RayInitCalled
    fake = types.ModuleType("ray")      # records whether the trainer starts / joins Ray
    fake.is_initialized = lambda: False
    fake.init = init
    sys.modules["ray"] = fake
    from xdistill.cli import main
    try:
        code = main(["train", "onpolicy", "--config", sys.argv[1]])
    except RayInitCalled:
        print("RAY_INIT_CALLED")
        sys.exit(0)
    sys.exit(code)
""")


def test_cli_trainer_can_start_a_ray_teacher_as_the_gpu_onpolicy_recipe_needs(tmp_path):
    """configs/onpolicy_gpu_qwen3_to_llama1b.yaml puts both teachers at ``worker.placement: ray``
    and its header launches it as ``torchrun ... -m xdistill.cli train onpolicy --config ...``.
    ``RayClient.start`` requires Ray to be initialised ("``ray.init`` is the caller's"), and
    nothing in the package calls ``ray.init`` (grep: only the error message names it), so a CLI
    user has no way to satisfy it.

    Expected: a CLI run with a ``placement: ray`` teacher initialises (or joins, e.g.
    ``ray.init(address="auto")`` / ``RAY_ADDRESS``) Ray itself before starting the actor.
    Actual: ``xdistill: error: teacher 'gpt' has placement 'ray' but Ray is not initialised;
    call ray.init(...) first``, exit 2: the shipped recipe cannot run as documented (off-policy
    configs with ``placement: ray`` likewise).
    Fix: call ``ray.init`` (address from an env var / a config key, ``ignore_reinit_error``) in
    the trainer's teacher setup when a teacher's placement is ``ray`` and Ray is not up; or make
    ``placement: ray`` without Ray a config error before compute and change the recipe.

    Here: a tiny on-policy config (random tiny teacher, GPT-2 tokenizer), a stand-in ``ray``
    module whose ``init`` stops the run at once, so the test never starts a cluster."""
    from xdistill.tiny import save_tiny_lm

    teacher = save_tiny_lm(tmp_path / "teacher", "gpt2", seed=1)
    cfg = yaml.safe_load((ROOT / "configs" / "onpolicy_tiny_cpu.yaml").read_text(encoding="utf-8"))
    cfg["teachers"] = [{"name": "gpt", "tokenizer": "gpt2", "loss": {"kind": "k3"},
                        "worker": {"model": str(teacher), "placement": "ray",
                                   "output": "logits"}}]
    cfg["prompts"]["paths"] = [str(ROOT / "configs" / "prompts_tiny.jsonl")]
    cfg["train"].update(out_dir=str(tmp_path / "run"), steps=1, tensorboard=False)
    cfg["checkpoint"].update(export_hf=False, resume="none")
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", RAY_CHILD, str(path)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert "RAY_INIT_CALLED" in proc.stdout, proc.stderr[-1500:]


def test_fetch_assets_dir_that_is_a_file_is_one_line_error(tmp_path):
    """tools/fetch_assets.py ``--dir`` (or ``$XDISTILL_ASSETS``) naming an existing file.

    Expected: ``fetch_assets: error: ... is not a folder``, exit 2 (what ``main`` prints for
    every AssetError).
    Actual: a ``NotADirectoryError`` traceback from ``downloads.mkdir`` in ``ensure_assets``
    (``make test`` / ``make demo`` run this script first).
    Fix: check the root in ``ensure_assets`` / ``asset_dir`` and raise AssetError, or catch
    OSError in ``main`` as one line."""
    target = tmp_path / "assets"
    target.write_text("not a folder\n")
    proc = _run([sys.executable, "tools/fetch_assets.py", "--dir", str(target), "--no-models"],
                timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "fetch_assets: error:" in proc.stderr


def test_make_tiny_models_out_that_is_a_file_is_one_line_error(tmp_path):
    """``python tools/make_tiny_models.py --out X`` (= ``python -m xdistill.tiny``, the README's
    setup step of the tiny recipes) with ``X`` an existing file.

    Expected: one line naming ``X`` (it is a file, not a folder) and a non-zero exit.
    Actual: a ``NotADirectoryError`` traceback from ``make_corpus`` (``raw.parent.mkdir``).
    Fix: check ``--out`` in ``xdistill.tiny.main`` before building anything
    (``parser.error``)."""
    target = tmp_path / "tiny_assets"
    target.write_text("not a folder\n")
    proc = _run([sys.executable, "tools/make_tiny_models.py", "--out", str(target),
                 "--train-steps", "0"], timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]


def test_readme_tree_rejects_an_unknown_option():
    """tools/readme_tree.py reads its options with ``"--check" in argv`` / ``"--write" in argv``:
    anything else (``--chek``, ``--Check``, ``--help``) prints the tree and exits 0.

    Expected: an unknown option is an error (exit 2, a usage line), so that a misspelled
    ``--check`` in a script or CI step cannot pass while the README tree is stale; ``--help``
    prints the usage (its docstring also omits ``--write``, which the module header of
    tests/test_readme.py tells users to run).
    Actual: exit 0 and the tree on stdout.
    Fix: argparse with ``--check`` / ``--write`` (as tools/stage_graph.py does)."""
    proc = _run([sys.executable, "tools/readme_tree.py", "--chek"], timeout=60)
    assert proc.returncode != 0, proc.stdout[:300]


def test_gpu_step_benchmark_skips_without_a_gpu_as_make_bench_needs():
    """``make bench`` runs ``benchmarks/gpu_step.py`` without ``--tiny``: on a machine without a
    CUDA GPU it would build 1B-parameter models and step 8 x 2048 tokens on the CPU. Expected:
    one "skipped" line and exit 0, as the vLLM benchmarks do without vLLM."""
    proc = _run([sys.executable, "benchmarks/gpu_step.py"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "gpu_step: skipped: no CUDA GPU here" in proc.stdout
