"""Training checkpoints with ``torch.distributed.checkpoint`` (DCP), written atomically.

Layout of one checkpoint (``<root>/step_0000120/``)::

    dcp/                 model + optimizer state, DCP format (each rank writes its own shards;
                         resharding to another world size works for these)
    rank_00000.pt ...    per-rank state: RNG (python, numpy, torch CPU, CUDA when present) and
                         the dataloader state dict that rank passed in
    trainer_state.pt     step, world size, scheduler state, ``extra`` (written by rank 0)
    meta.json            the same facts in human-readable form
    COMPLETE             marker, written last

Atomicity: everything is written into ``step_XXXXXXX.tmp/``; when every rank has finished (a
barrier), rank 0 fsyncs, writes ``COMPLETE`` and renames the folder to ``step_XXXXXXX`` (an
atomic rename on POSIX file systems). A crash at any point leaves either a ``.tmp`` folder (ignored
by :func:`latest_checkpoint` and deleted by the next save) or a finished checkpoint; the previous
good checkpoint is never touched before the new one is complete. Re-saving a step that exists
moves the old copy to ``step_N.old`` just before the rename; a crash between the two renames leaves
it there, and resuming or the next save renames it back (:func:`recover_interrupted`). A failed
write (a full disk: ``ENOSPC``, or torch's ``inline_container.cc ... unexpected pos``, also inside DCP's
``CheckpointException``) removes the ``.tmp`` folder and raises one :class:`CheckpointError` line
naming the folder and the intact previous checkpoint. Keep-last-N pruning runs after the rename. A run
that starts before the latest checkpoint (resumed from an older one, or fresh in a used folder)
renames the later ones ``step_N.abandoned`` first (:func:`set_aside_newer`): pruning and
``resume: auto`` then see only its own branch. With several nodes, ``root`` must be on a file system all ranks share.

Works on one plain process (no process group) and with FSDP2 (sharded DTensor states through
``get_state_dict``/``set_state_dict``). The ``.pt`` files are loaded with ``weights_only=False``
(they hold numpy RNG state and arbitrary dataloader state): load only checkpoints you wrote.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)

from xdistill import distributed as xdist
from xdistill.errors import XDistillError

COMPLETE = "COMPLETE"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(XDistillError):
    """A checkpoint that is missing, incomplete or incompatible with this run."""


@dataclass
class ResumeState:
    """What :func:`load_checkpoint` hands back besides the states it loads in place."""

    # optimizer steps taken when the checkpoint was written
    step: int
    # folder the state came from
    path: Path
    # this rank's dataloader state dict (None if none was saved)
    dataloader_state: Any = None
    # the ``extra`` dict passed to save_checkpoint (e.g. samples seen, best eval loss)
    extra: dict = field(default_factory=dict)
    # this rank's RNG states (:func:`capture_rng_state`), restored or not (None if none saved)
    rng: dict | None = None


def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    """``<root>/step_XXXXXXX`` for ``step``."""
    return Path(root) / f"step_{step:07d}"


def is_complete(path: str | os.PathLike) -> bool:
    """True for a finished checkpoint folder (name ``step_N``, ``COMPLETE`` marker present)."""
    path = Path(path)
    return bool(_STEP_DIR.match(path.name)) and (path / COMPLETE).is_file()


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step (``.tmp`` and unmarked folders skipped)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def recover_interrupted(root: str | os.PathLike) -> list[Path]:
    """Rename each complete ``step_N.old`` whose ``step_N`` is missing back to ``step_N`` (a crash
    while re-saving step N, between moving the old copy aside and renaming the new one in);
    returns the restored folders. Safe on every rank at once: a rank that loses the race to rename
    finds the folder already restored."""
    root = Path(root)
    if not root.is_dir():
        return []
    restored = []
    for child in sorted(root.iterdir()):
        stem, dot, suffix = child.name.rpartition(".")
        if not (dot and suffix == "old" and _STEP_DIR.match(stem)):
            continue
        final = child.with_name(stem)
        if final.exists() or not (child / COMPLETE).is_file():
            continue
        try:
            os.replace(child, final)
        except FileNotFoundError:  # another rank restored it first
            continue
        restored.append(final)
    return restored


def resolve_resume(resume: str | None, root: str | os.PathLike) -> Path | None:
    """``--resume`` semantics: None/""/"none" -> no resume; "auto" -> the latest complete
    checkpoint under ``root`` (None when there is none yet); otherwise a path that must be
    complete (a folder named ``none``: ``./none``). A re-save interrupted between its two renames
    is recovered first (:func:`recover_interrupted`)."""
    if not resume or resume == "none":
        return None
    recover_interrupted(root)
    if resume == "auto":
        return latest_checkpoint(root)
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"resume checkpoint {resume!r} does not exist")
    if not is_complete(path):
        raise CheckpointError(f"resume checkpoint {resume!r} is incomplete (no {COMPLETE} marker, "
                              "or not a step_N folder); it was probably interrupted while written")
    return path


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: python, numpy (global), torch CPU, every CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, obj: Any) -> None:
    torch.save(obj, path)
    _fsync_file(path)


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group; one plain process is a supported mode."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _model_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _group_params(optim_sd) -> list[list[str]] | None:
    """The parameter names of each optimizer group in a DCP optimizer state dict."""
    if not optim_sd or "param_groups" not in optim_sd:
        return None
    return [sorted(str(p) for p in g.get("params", ())) for g in optim_sd["param_groups"]]


def _check_groups(path: Path, want, got) -> None:
    """Refuse a checkpoint whose optimizer groups hold other parameters than this run's (its
    moments would land in the wrong groups and the groups lose their settings)."""
    if want is None or got is None or want == got:
        return
    moved = sorted(set().union(*map(set, want)) ^ set().union(*map(set, got))) or sorted(
        n for w, g in zip(want, got) for n in set(w) ^ set(g))
    raise CheckpointError(
        f"{str(path)!r}: its optimizer groups hold other parameters than this run's "
        f"({len(got)} groups of {[len(g) for g in got]} parameters, this run {[len(w) for w in want]}; "
        f"e.g. {moved[:3]}): keep optim.decay_embeddings (and the model) as the run that wrote it "
        "had them, or start afresh (--resume none)")


def _prepare_tmp(root: Path, tmp: Path) -> None:
    """Rank 0: create ``root``, restore an interrupted re-save's ``step_N.old``, delete stale
    ``*.tmp``/``*.old`` folders (crash leftovers), make ``tmp``."""
    root.mkdir(parents=True, exist_ok=True)
    recover_interrupted(root)
    for child in root.iterdir():
        stem, dot, suffix = child.name.rpartition(".")
        if dot and suffix in ("tmp", "old") and _STEP_DIR.match(stem) and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
    tmp.mkdir()


def _write_rank_state(tmp: Path, dataloader_state: Any) -> None:
    _write(tmp / f"rank_{xdist.get_rank():05d}.pt",
           {"rng": capture_rng_state(), "dataloader": dataloader_state})


def _finalize(tmp: Path, final: Path, meta: dict[str, Any]) -> None:
    """Rank 0: marker, fsync, atomic rename (an older copy of the same step is replaced)."""
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (tmp / COMPLETE).write_text(f"{meta['step']}\n", encoding="utf-8")
    for path in tmp.iterdir():
        if path.is_file():
            _fsync_file(path)
    old = None
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_file(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def set_aside_newer(root: str | os.PathLike, step: int) -> list[Path]:
    """Rename the complete checkpoints of ``root`` past ``step`` to ``step_N.abandoned`` (then
    ``.abandoned-2``, ...); returns their new paths. A run that starts at ``step`` (resumed from
    an older checkpoint, or fresh in a used folder) writes its own ``step_N`` after it: left in
    place, those of the abandoned branch would outlive the new ones under keep-last pruning (it
    keeps the highest steps) and be the ones ``resume: auto`` picks. Renamed, not deleted: they
    stay loadable by path once renamed back."""
    moved = []
    for old_step, path in list_checkpoints(root):
        if old_step <= step:
            continue
        target, k = path.with_name(path.name + ".abandoned"), 1
        while target.exists():
            k += 1
            target = path.with_name(f"{path.name}.abandoned-{k}")
        os.replace(path, target)
        moved.append(target)
    return moved


def prune_checkpoints(root: str | os.PathLike, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (0 = keep all); returns the
    deleted folders. Incomplete folders are not touched here (the next save removes ``.tmp``)."""
    if keep_last <= 0:
        return []
    doomed = [path for _, path in list_checkpoints(root)[:-keep_last]]
    for path in doomed:
        (path / COMPLETE).unlink(missing_ok=True)  # a half-deleted folder is never "complete"
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def save_checkpoint(root: str | os.PathLike, step: int, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None, *,
                    dataloader_state: Any = None, extra: dict | None = None,
                    keep_last: int = 0) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; returns its folder.

    Collective with a process group: every rank calls it with its own ``dataloader_state`` (the
    model/optimizer states are gathered by DCP). ``extra``: small picklable dict saved by rank 0.
    ``keep_last``: prune to this many complete checkpoints afterwards (0 = keep all).
    """
    root = Path(root)
    final = checkpoint_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    try:
        _write_all(root, tmp, final, step, model, optimizer, scheduler, dataloader_state, extra)
    except (OSError, RuntimeError, CheckpointException) as exc:   # CheckpointException: a
        err = write_error(exc, final)                              # BaseException (DCP)
        if err is None:
            raise
        if xdist.is_main_process():
            shutil.rmtree(tmp, ignore_errors=True)   # free what the failed write took
        raise err from None
    if xdist.is_main_process():
        prune_checkpoints(root, keep_last)
    xdist.barrier()
    return final


def _write_all(root: Path, tmp: Path, final: Path, step: int, model, optimizer, scheduler,
               dataloader_state, extra) -> None:
    """Every write of :func:`save_checkpoint` up to the atomic rename of ``tmp`` to ``final``."""
    if xdist.is_main_process():
        _prepare_tmp(root, tmp)
    xdist.barrier()

    with _single_process_quiet():
        dcp.save(_model_optim_state(model, optimizer), checkpoint_id=str(tmp / "dcp"),
                 no_dist=not xdist.is_distributed())
    _write_rank_state(tmp, dataloader_state)
    xdist.barrier()
    if xdist.is_main_process():
        world = xdist.get_world_size()
        _write(tmp / "trainer_state.pt", {
            "format": FORMAT_VERSION, "step": step, "world_size": world,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "extra": dict(extra or {}),
        })
        meta = {"format": FORMAT_VERSION, "step": step, "world_size": world,
                "has_optimizer": optimizer is not None, "has_scheduler": scheduler is not None,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__}
        _finalize(tmp, final, meta)


_WRITE_FAILED = ("unexpected pos", "PytorchStreamWriter", "file write failed", "inline_container")


def write_error(exc: BaseException, final: Path) -> CheckpointError | None:
    """One line for a failed checkpoint write: the folder, the reason (a full disk shows as
    ENOSPC, or from torch's zip writer as ``inline_container.cc ... unexpected pos``, also inside
    DCP's ``CheckpointException``) and the previous checkpoint, which the atomic write kept
    intact. None when ``exc`` is no I/O failure (it should propagate unchanged)."""
    inner = _dcp_inner(exc)
    if isinstance(inner, OSError):
        reason = {errno.ENOSPC: "no space left on the device",
                  errno.EFBIG: "a file grew past the file-size limit (ulimit -f)",
                  errno.EDQUOT: "the disk quota is exceeded"}.get(inner.errno,
                                                                  inner.strerror or str(inner))
    else:
        text = (str(inner).strip().splitlines() or [type(inner).__name__])[0][:200]
        if not isinstance(inner, RuntimeError) or not any(s in text for s in _WRITE_FAILED):
            return None
        reason = f"a write failed, is the disk full? ({text})"
    previous = latest_checkpoint(final.parent)
    kept = (f"the previous checkpoint {previous} is intact" if previous is not None
            else "no earlier checkpoint exists")
    return CheckpointError(f"writing checkpoint {final} failed: {reason}; {kept} (free space, "
                           "then run the same command again to resume)")


def _dcp_inner(exc: BaseException) -> BaseException:
    """The first rank's underlying exception of a DCP CheckpointException (else ``exc``)."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, CheckpointException) and failures:
        wrapped = sorted(failures.items())[0][1]
        return wrapped[0] if isinstance(wrapped, tuple) else wrapped
    return exc


def _read_rank_state(path: Path, world: int, strict_world_size: bool) -> dict[str, Any] | None:
    here = xdist.get_world_size()
    if world != here:
        if strict_world_size:
            raise CheckpointError(
                f"checkpoint {str(path)!r} was written by {world} rank(s) but this run has {here}: "
                "per-rank RNG and dataloader states cannot be mapped (set "
                "checkpoint.strict_world_size=false to load only the model, optimizer and "
                "scheduler)")
        return None
    rank_file = path / f"rank_{xdist.get_rank():05d}.pt"
    if not rank_file.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {rank_file.name}")
    return torch.load(rank_file, map_location="cpu", weights_only=False)


def _dcp_reason(exc: BaseException) -> str:
    """The first rank's underlying error of a DCP CheckpointException (else the message)."""
    failures = getattr(exc, "failures", None)
    if failures:
        rank = sorted(failures)[0]
        inner = _dcp_inner(exc)
        return f"rank {rank}: {type(inner).__name__}: {inner}"
    return f"{type(exc).__name__}: {exc}"


def load_checkpoint(path: str | os.PathLike, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None, *,
                    restore_rng: bool = True, strict_world_size: bool = True) -> ResumeState:
    """Load a complete checkpoint into ``model``/``optimizer``/``scheduler`` in place.

    The model must already have its final structure (parallelized the same way, or not at all: DCP
    reshards between world sizes, and a sharded checkpoint loads into a plain model). Restores this
    rank's RNG states unless ``restore_rng`` is false, and returns its dataloader state.
    """
    path = Path(path)
    if not is_complete(path):
        raise CheckpointError(f"checkpoint {str(path)!r} is missing or incomplete (no {COMPLETE} marker)")
    trainer = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    if optimizer is not None and not (path / "dcp").is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} has no dcp/ folder")
    rank_state = _read_rank_state(path, trainer["world_size"], strict_world_size)
    states = _model_optim_state(model, optimizer)
    groups = _group_params(states.get("optim"))
    try:
        with _single_process_quiet():
            dcp.load(states, checkpoint_id=str(path / "dcp"), no_dist=not xdist.is_distributed())
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        raise CheckpointError(f"cannot load model/optimizer state from {str(path)!r}: "
                              f"{_dcp_reason(exc)}") from exc
    if optimizer is None:
        set_model_state_dict(model, states["model"])
    else:
        _check_groups(path, groups, _group_params(states["optim"]))
        set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optim"])
    if scheduler is not None:
        if trainer["scheduler"] is None:
            raise CheckpointError(f"checkpoint {str(path)!r} holds no scheduler state")
        scheduler.load_state_dict(trainer["scheduler"])
    if rank_state is not None and restore_rng:
        restore_rng_state(rank_state["rng"])
    return ResumeState(step=int(trainer["step"]), path=path,
                       dataloader_state=rank_state["dataloader"] if rank_state else None,
                       extra=dict(trainer["extra"]),
                       rng=rank_state["rng"] if rank_state else None)
