"""The prepared GPU check: run xdistill's GPU path once, in minutes, on a machine with one GPU.

    python tools/gpu_check.py --prepare .gpu_bundle          # here, with network: wheels + assets
    python tools/gpu_check.py --bundle .gpu_bundle --out results/   # on the GPU machine
    python tools/gpu_check.py --dry-run --out /tmp/gpu_check       # CPU: every part, tiny sizes

On a machine of your own that has xdistill installed (``make install``) and its assets fetched,
``python tools/gpu_check.py --out results/`` is enough: ``--bundle`` is for a bare machine
without network (the bundle carries the wheels that machine lacks and the tokenizer/corpus assets).

Parts, in order (each a child process with its own time limit, its output streamed with a
heartbeat every 10 s; results are written after every part, so a kill keeps what finished):

1. ``env``   torch / CUDA / driver versions, GPU name, free memory, a bf16 matmul rate;
2. ``tests`` ``pytest -m "gpu or multigpu"``: CUDA IPC slots and leases across two processes, the
             2-process teacher -> student hand-off bitwise equal to in-process, CUDA teachers in
             each placement, the trainer on CUDA with checkpoint/resume, FSDP2 on NCCL (one
             rank), projection ops on CUDA (multigpu tests skip themselves with one GPU);
3. ``step``  ``benchmarks/gpu_step.py``: the off-policy step at real model shapes (random-init
             Llama-3.2-1B-shaped student, Qwen2.5-1.5B-shaped teacher, 8 x 2048 tokens, bf16) with
             full logits / projected / top-k teacher outputs and over CUDA IPC;
4. ``cpu``   (only when asked: ``--parts cpu``) ``benchmarks/real/step.py --random-init`` on the
             host CPU, GPU hidden, 2 cores (``taskset``): the real-pair step (Gemma-3-270M ->
             SmolLM2-135M shapes) with the real config's teacher ``output: support``,
             float32 vs ``dtype: auto``, under xdistill's OpenMP wait default and never
             spinning (``@passive``, how the earlier leases measured) (``--cpu-variants``), 2
             rounds (``--cpu-repeats``); on a CPU with AMX-BF16 this is the bf16 speed-up the
             2-core development machines (no AMX) cannot show.
5. ``profile`` (only when asked: ``--parts profile``) ``benchmarks/real/profile_step.py
             --random-init``: the same step's ops under torch.profiler, float32 and auto
             (``--profile-variants``), on the same 2 cores: which ops the bf16 step still
             spends its time in.

Writes ``gpu_check.json`` and ``gpu_check.md`` (plus ``tests.log``, ``junit.xml``, ``step.log``,
``step.md``: six files; the cpu and profile parts add ``cpu.log``, ``cpu_step.md``,
``profile.log``, ``profile_step.md``) into ``--out``. ``--dry-run`` runs the same parts on CPU:
the environment, the GPU tests' collection (they import and are selected), and the step
benchmark with 2-layer models.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# packages the GPU machine's image lacks (its package list: torch, transformers, numba, pyarrow,
# scipy, tokenizers, sentencepiece, tiktoken, pytest, hypothesis ... are there)
WHEELS = ("torchdata==0.11.0", "gguf==0.19.0")
TOKENIZERS = ("gpt2", "qwen2", "llama3")  # small real tokenizers the GPU tests and benchmark use
CPU_MODELS = ("gemma3-270m", "smollm2-135m")  # the cpu part's real pair (configs + tokenizers)
CPU_PROJECTION = "proj_smollm2_gemma3.npz"
BUNDLE_LIMIT_MB = 64.0                    # what travels to the GPU machine, the tree included
DEFAULT_BUDGET_S = 480.0
# seconds at most per part; "step" gets the rest. On an H200 machine (2026-11-26) env took 11 s,
# the 9 GPU tests > 210 s (~30 s per trainer CLI run there), a step variant 50-90 s
PART_SHARE = {"env": 30.0, "tests": 200.0}
PARTS = ("env", "tests", "step", "cpu", "profile")


def say(msg: str) -> None:
    print(f"[gpu_check] {msg}", flush=True)


# --------------------------------------------------------------------------- --prepare
def prepare(bundle: Path) -> dict:
    """Wheels for the GPU machine's Python 3.12 and the asset archive, under ``bundle``."""
    from xdistill.assets import asset_dir

    bundle.mkdir(parents=True, exist_ok=True)
    wheels = bundle / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--platform",
           "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "any",
           "-d", str(wheels), *WHEELS]
    say(f"downloading {', '.join(WHEELS)} for Python 3.12")
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"gpu_check --prepare: pip download of {', '.join(WHEELS)} failed")
    root = asset_dir()
    missing = [p for p in [root / "tokenizers" / t for t in TOKENIZERS]
               + [root / "corpus" / "shakespeare"] if not p.is_dir()]
    if missing:
        raise SystemExit(f"gpu_check --prepare: {missing[0]} is missing; run "
                         "`python tools/fetch_assets.py` first")
    with tarfile.open(bundle / "assets.tar.gz", "w:gz") as tar:
        for t in TOKENIZERS:
            tar.add(root / "tokenizers" / t, arcname=f"tokenizers/{t}")
        tar.add(root / "corpus" / "shakespeare", arcname="corpus/shakespeare")
        for m in CPU_MODELS:    # configs and tokenizers only: the cpu part random-initialises
            tar.add(root / "models" / m, arcname=f"models/{m}",
                    filter=lambda ti: None if ti.name.endswith(".safetensors") else ti)
    build_projection(bundle / "proj_llama3_qwen2.npz")
    cpu_projection(bundle / CPU_PROJECTION)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) / 2**20
    tree = tracked_tree_mb()
    info = {"bundle_mb": round(size, 2), "tree_mb": round(tree, 2),
            "files": sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file())}
    (bundle / "MANIFEST.json").write_text(json.dumps(info, indent=1))
    say(f"bundle {bundle}: {size:.1f} MB + tree {tree:.1f} MB (limit {BUNDLE_LIMIT_MB:.0f} MB)")
    if size + tree > BUNDLE_LIMIT_MB:
        raise SystemExit(f"gpu_check --prepare: {size + tree:.1f} MB would travel, over the "
                         f"{BUNDLE_LIMIT_MB:.0f} MB limit")
    return info


def _script(name: str, *parts: str):
    """A benchmark script of this repository, imported by path (``benchmarks/`` is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO.joinpath(*parts))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_projection(path: Path) -> None:
    """The step benchmark's Llama-3 -> Qwen2 projection, built here (seconds saved there)."""
    _script("gpu_step", "benchmarks", "gpu_step.py").build_projection(path)


def cpu_projection(path: Path) -> None:
    """The cpu part's SmolLM2 <- Gemma-3 projection (``benchmarks/real/step.py``'s), built here."""
    _script("real_step", "benchmarks", "real", "step.py").build_projection(path)


def tracked_tree_mb() -> float:
    """Size of the files git tracks (what travels besides the bundle)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                               check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return 0.0
    return sum((REPO / n.decode()).stat().st_size for n in names
               if n and (REPO / n.decode()).is_file()) / 2**20


# --------------------------------------------------------------------------- environment
def child_env(bundle: Path | None) -> dict:
    """Environment of every part's process: the bundle's wheels and assets when given."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    paths = [str(REPO)]
    if bundle is not None:
        for need in (bundle / "wheels", bundle / "assets.tar.gz"):
            if not need.exists():
                raise SystemExit(f"gpu_check: {need} is missing; make the bundle with "
                                 f"`python tools/gpu_check.py --prepare {bundle}`")
        tmp = Path(tempfile.mkdtemp(prefix="xdistill_gpu_"))
        site, assets = tmp / "site", tmp / "assets"
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
               "--no-compile", "--target", str(site), *map(str, (bundle / "wheels").glob("*.whl"))]
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"gpu_check: installing the wheels of {bundle}/wheels failed")
        with tarfile.open(bundle / "assets.tar.gz") as tar:
            tar.extractall(assets, filter="data")
        paths.insert(0, str(site))
        env["XDISTILL_ASSETS"] = str(assets)
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def env_report() -> dict:
    """Versions, the GPU and its free memory, and a bf16 matmul rate (run in a child)."""
    import platform

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "cpu_count": os.cpu_count(), **cpu_model()}
    for mod in ("transformers", "numba", "numpy", "torchdata", "pyarrow", "tokenizers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:  # reported, not fatal: the tests part names what breaks
            out[mod] = f"missing ({type(exc).__name__})"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["nvidia_smi"] = f"unavailable ({type(exc).__name__})"
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        out.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                   free_gb=round(free / 2**30, 1), total_gb=round(total / 2**30, 1),
                   nccl=".".join(map(str, torch.cuda.nccl.version())),
                   bf16_matmul_tflops=round(matmul_rate("cuda", 8192), 1))
    else:
        out["cpu_bf16_matmul_tflops"] = round(matmul_rate("cpu", 512), 3)
    return out


def cpu_model() -> dict:
    """The host CPU's model name and its bf16 instruction flags (``/proc/cpuinfo``)."""
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                 if ln.startswith("model name")), "unknown")
    flags = sorted({f for f in text.split() if f.startswith("amx") or f == "avx512_bf16"})
    return {"cpu_model": name, "cpu_bf16_flags": flags}


def matmul_rate(device: str, n: int) -> float:
    """TFLOP/s of an n x n x n bf16 matmul (mean of 10 after 3 warm-ups)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync()
    return 10 * 2 * n ** 3 / (time.perf_counter() - t0) / 1e12


# --------------------------------------------------------------------------- running parts
def run_part(name: str, cmd: list[str], env: dict, log: Path, limit_s: float) -> dict:
    """Run ``cmd`` streaming its output to the console and ``log``; a heartbeat every 10 s; the
    whole process group is killed after ``limit_s``."""
    say(f"{name}: start (limit {limit_s:.0f} s): {' '.join(cmd[-4:])}")
    t0, last = time.perf_counter(), [time.perf_counter()]
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)

        def pump():
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                print(f"  {name}| {line}", end="", flush=True)
                last[0] = time.perf_counter()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        while proc.poll() is None:
            time.sleep(1.0)
            el = time.perf_counter() - t0
            if el > limit_s:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if time.perf_counter() - last[0] >= 10:
                say(f"{name}: running, {el:.0f} s of {limit_s:.0f} s")
                last[0] = time.perf_counter()
        proc.wait()
        reader.join(timeout=5)
    seconds = time.perf_counter() - t0
    say(f"{name}: {'killed at its limit' if timed_out else f'exit {proc.returncode}'} "
        f"after {seconds:.0f} s")
    return {"rc": proc.returncode, "timed_out": timed_out, "seconds": round(seconds, 1)}


def log_summary(log: Path) -> dict:
    """Counts from pytest's ``-v`` lines (``path::test PASSED``) of a run killed before its
    JUnit file was written: what finished, and the test that was running."""
    words = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "errors"}
    counts = {w: 0 for w in words.values()}
    failures, unfinished = [], ""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    for line in text.splitlines():
        parts = line.split()
        if not parts or "::" not in parts[0]:
            continue
        state = words.get(parts[1]) if len(parts) > 1 else None
        if state is None:
            unfinished = parts[0]
            continue
        counts[state] += 1
        unfinished = ""
        if state in ("failed", "errors"):
            failures.append({"test": parts[0], "message": "see tests.log"})
    return dict(counts, failures=failures, unfinished=unfinished,
                note="pytest was killed before writing junit.xml; counts from tests.log")


def junit_summary(path: Path) -> dict:
    """Counts and the failing tests (name + first line of the message) of a JUnit XML file."""
    if not path.is_file():
        return log_summary(path.with_name("tests.log"))
    root = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failures = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed" if bad.tag == "failure" else "errors"] += 1
            failures.append({"test": name, "message": (bad.get("message") or "")[:300]})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return dict(counts, failures=failures)


# --------------------------------------------------------------------------- the check
def part_commands(args, out: Path, work: Path, left_s: float) -> dict[str, list[str]]:
    py = sys.executable
    tests = [py, "-m", "pytest", "-m", "gpu or multigpu", "-p", "no:cacheprovider", "-v",
             "--timeout", "180",
             "--continue-on-collection-errors",
             "-o", "addopts=-ra", "--junitxml", str(out / "junit.xml"), "tests"]
    if args.tests_k:
        tests[3:3] = ["-k", args.tests_k]
    step = [py, str(REPO / "benchmarks" / "gpu_step.py"), "--out-md", str(out / "step.md"),
            "--out-json", str(work / "step.json"), "--budget-s", str(max(60, int(left_s - 45))),
            "--variants", args.variants]
    proj = Path(args.bundle) / "proj_llama3_qwen2.npz" if args.bundle else None
    if proj is not None and proj.is_file():
        step += ["--projection", str(proj)]
    if args.dry_run:
        tests.append("--collect-only")
        step += ["--tiny", "--steps", "2", "--batch", "2", "--micro-batch", "1",
                 "--seq-len", "128", "--workers", "1"]
    cpu = [py, str(REPO / "benchmarks" / "real" / "step.py"), "--random-init", "--variants",
           args.cpu_variants, "--repeats", str(args.cpu_repeats), "--out", str(out / "cpu_step.md")]
    profile = [py, str(REPO / "benchmarks" / "real" / "profile_step.py"), "--random-init",
               "--variants", args.profile_variants, "--out", str(out / "profile_step.md")]
    if args.bundle and (Path(args.bundle) / CPU_PROJECTION).is_file():
        cpu += ["--projection", str(Path(args.bundle) / CPU_PROJECTION)]
        profile += ["--projection", str(Path(args.bundle) / CPU_PROJECTION)]
    if args.dry_run:
        cpu += ["--steps", "2", "--batch", "1", "--seq-len", "16", "--repeats", "1"]
        profile += ["--steps", "1", "--batch", "1", "--seq-len", "16", "--top", "5"]
    if shutil.which("taskset"):      # 2 cores, as the machines the CPU numbers come from
        cpu, profile = ["taskset", "-c", "0,1", *cpu], ["taskset", "-c", "0,1", *profile]
    return {"env": [py, str(Path(__file__).resolve()), "--child-env", str(work / "env.json")],
            "tests": tests, "step": step, "cpu": cpu, "profile": profile}


def check(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))  # intermediate files (out: at most 8)
    t0 = time.perf_counter()
    env = child_env(Path(args.bundle) if args.bundle else None)
    results: dict = {"dry_run": args.dry_run, "budget_s": args.budget_s, "parts": {}}
    parts = [p for p in PARTS if p in args.parts.split(",")]
    for name in parts:
        left = args.budget_s - (time.perf_counter() - t0)
        if left < 30:
            results["parts"][name] = {"skipped": f"{left:.0f} s of the budget left"}
            continue
        cmd = part_commands(args, out, work, left)[name]
        share = args.tests_limit_s if name == "tests" and args.tests_limit_s else None
        limit = min(share or PART_SHARE.get(name, left), left)
        log = (work if name == "env" else out) / f"{name}.log"
        res = run_part(name, cmd, {**env, "CUDA_VISIBLE_DEVICES": ""} if name in ("cpu", "profile") else env,
                       log, limit)
        if name == "env" and (work / "env.json").is_file():
            res["report"] = json.loads((work / "env.json").read_text())
        if name == "tests" and not args.dry_run:
            res["summary"] = junit_summary(out / "junit.xml")
        if name == "step" and (work / "step.json").is_file():
            res["variants"] = json.loads((work / "step.json").read_text())
        results["parts"][name] = res
        results["seconds"] = round(time.perf_counter() - t0, 1)
        write_results(out, results)
    ok = all(r.get("rc") == 0 for r in results["parts"].values())
    say(f"done in {time.perf_counter() - t0:.0f} s: {'all parts passed' if ok else 'FAILURES'}; "
        f"{out / 'gpu_check.md'}")
    return 0 if ok else 1


def write_results(out: Path, results: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    (out / "gpu_check.md").write_text(markdown(results, out), encoding="utf-8")


def markdown(results: dict, out: Path) -> str:
    parts = results["parts"]
    lines = ["# xdistill GPU check" + (" (dry run on CPU)" if results["dry_run"] else ""), ""]
    env = parts.get("env", {}).get("report", {})
    if env:
        lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in env.items()] + [""]
    lines += ["| part | result | seconds |", "|---|---|---|"]
    for name, r in parts.items():
        state = r.get("skipped") or ("killed at its limit" if r.get("timed_out") else
                                     "ok" if r.get("rc") == 0 else f"exit {r.get('rc')}")
        lines.append(f"| {name} | {state} | {r.get('seconds', '')} |")
    summary = parts.get("tests", {}).get("summary")
    if summary and "error" not in summary:
        lines += ["", "GPU tests: " + ", ".join(f"{summary[k]} {k}" for k in
                                                ("passed", "failed", "errors", "skipped")), ""]
        lines += [f"* FAILED `{f['test']}`: {f['message']}" for f in summary["failures"]]
        if summary.get("unfinished"):
            lines.append(f"* killed at the part's limit while running `{summary['unfinished']}`")
    for md in ("step.md", "cpu_step.md", "profile_step.md"):
        if (out / md).is_file():
            lines += ["", (out / md).read_text(encoding="utf-8")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check_results", help="folder for the results")
    ap.add_argument("--bundle", default="", help="a folder made by --prepare (bare machines)")
    ap.add_argument("--prepare", metavar="DIR", default="",
                    help="download the wheels and pack the assets into DIR, then stop")
    ap.add_argument("--dry-run", action="store_true", help="run every part on CPU, tiny sizes")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="seconds for the whole check; later parts shrink to fit")
    ap.add_argument("--parts", default="env,tests,step",
                    help=f"comma-separated, from {', '.join(PARTS)}")
    ap.add_argument("--variants", default="",
                    help="step benchmark variants, in order (default: all; dry run: logits,topk)")
    ap.add_argument("--cpu-variants",
                    default="support,support_auto,support@passive,support_auto@passive",
                    help="benchmarks/real/step.py variants of the cpu part")
    ap.add_argument("--cpu-repeats", type=int, default=2, help="rounds of the cpu part")
    ap.add_argument("--profile-variants", default="float32,auto",
                    help="benchmarks/real/profile_step.py variants of the profile part "
                         "(e.g. support,support_auto: the real config's teacher output)")
    ap.add_argument("--tests-k", default="",
                    help="pytest -k expression for the tests part (e.g. rerun what a lease missed)")
    ap.add_argument("--tests-limit-s", type=float, default=0.0,
                    help=f"seconds for the tests part (default {PART_SHARE['tests']:.0f})")
    ap.add_argument("--child-env", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_env:
        report = env_report()
        Path(args.child_env).write_text(json.dumps(report, indent=1))
        print(json.dumps(report, indent=1))
        return 0
    if args.prepare:
        prepare(Path(args.prepare))
        return 0
    unknown = [p for p in args.parts.split(",") if p not in PARTS]
    if unknown or not args.parts:
        ap.error(f"--parts: unknown part {unknown[0] if unknown else '(none)'!r}; "
                 f"choose from {', '.join(PARTS)}, comma-separated without spaces")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out {args.out} is a file, not a folder")
    args.variants = args.variants or ("logits,topk" if args.dry_run else
                                      "topk,logits,projected,ipc")
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
