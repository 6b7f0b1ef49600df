"""export_hf on two ranks when rank 0's write fails: the other rank gets a clear error at once.

Rank 0 writes the export and the other ranks wait for it. They used to wait in a barrier: a rank
0 that failed (a full disk, a path under a file) and did not exit at once (a caller that catches
the error, a slow teardown) left them waiting until the process group's timeout (30 min by
default; NCCL gives no error on a dead peer). Now rank 0 broadcasts its outcome and the others
raise an error naming it. Two processes started with ``multiprocessing`` (gloo on CPU), not
torchrun, whose agent would kill the waiting rank as soon as rank 0 exits.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from pathlib import Path

from distributed_helpers import build_tiny, free_port

HOLD_S = 60.0     # rank 0 stays alive this long after its failure (a slow teardown)


def _worker(rank: int, port: int, out: str, log: str) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    from xdistill import distributed as xdist
    from xdistill.student.model import export_hf

    xdist.init_distributed(timeout_s=HOLD_S * 4)
    model, _ = build_tiny()
    t0 = time.monotonic()
    try:
        export_hf(model, out)
        result = "ok"
    except Exception as exc:   # noqa: BLE001 - the test reads what each rank saw
        result = f"{type(exc).__name__}: {exc}"
    Path(log + ".tmp").write_text(f"{time.monotonic() - t0:.2f}\n{result}\n")
    os.replace(log + ".tmp", log)      # the test never reads a half-written log
    if rank == 0:
        time.sleep(HOLD_S)
    os._exit(0)


def test_other_ranks_raise_when_rank_0_fails_to_write(tmp_path):
    out = str(tmp_path / "export")
    (tmp_path / "export.tmp").write_text("not a folder")   # rank 0's staging mkdir fails
    ctx = mp.get_context("spawn")
    port = free_port()
    logs = [str(tmp_path / f"rank{r}.log") for r in range(2)]
    procs = [ctx.Process(target=_worker, args=(r, port, out, logs[r])) for r in range(2)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + HOLD_S
        # rank 0 broadcasts its failure before it writes its own log: wait for both
        while time.monotonic() < deadline and not all(Path(x).exists() for x in logs):
            time.sleep(0.2)
        assert Path(logs[1]).exists(), "rank 1 still waits for rank 0 (rank 0 is alive)"
        assert Path(logs[0]).exists(), "rank 0 wrote no log"
        took, seen = Path(logs[1]).read_text().splitlines()
        rank0 = Path(logs[0]).read_text().splitlines()[1]
        assert rank0.split(":")[0] in ("FileExistsError", "NotADirectoryError"), rank0
        assert seen.startswith("XDistillError") and "failed on rank 0" in seen, seen
        assert rank0.split(":")[0] in seen and out in seen, seen
        assert float(took) < HOLD_S / 2
    except Exception:
        traceback.print_exc()
        raise
    finally:
        for p in procs:
            p.kill()
            p.join(10)
