"""The projection artifact: CSR matrix in ``.npz`` plus a JSON sidecar, saved and validated.

Files (``out.npz`` and ``out.json`` side by side):

* ``out.npz`` (a zip of ``.npy`` arrays, written by hand with fixed member order, fixed zip
  timestamps and no pickles, so the same matrix always gives the same bytes):
  ``indptr`` (int64 ``[Vs+1]``), ``indices`` (int32 ``[N]``, sorted inside each row), ``data``
  (float32 ``[N]``), ``shape`` (int64 ``[2]`` = ``(Vs, Vt)``), ``row_source`` (int8 ``[Vs]``: which
  method filled each row, see :data:`SOURCE_NAMES`).
* ``out.json``: direction (``student_to_teacher``: row ``s`` is a distribution over teacher ids),
  both tokenizers' names, fingerprints and vocab sizes, methods and parameters, top-K, xdistill
  version, coverage summary and the SHA-256 of the ``.npz`` (a sidecar from another build is
  refused).

:func:`load_projection` refuses a matrix built for other tokenizers, naming both pairs.

Legend: ``Vs``/``Vt`` student/teacher vocabularies, ``N`` non-zeros.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xdistill.errors import ProjectionError

SOURCE_UNMAPPED, SOURCE_EXACT, SOURCE_MULTITOKEN, SOURCE_CORPUS, SOURCE_ROLE = 0, 1, 2, 3, 4
SOURCE_NAMES = {SOURCE_UNMAPPED: "unmapped", SOURCE_EXACT: "exact", SOURCE_MULTITOKEN: "multitoken",
                SOURCE_CORPUS: "corpus", SOURCE_ROLE: "role"}
DIRECTION = "student_to_teacher"
FORMAT = "xdistill-projection"
FORMAT_VERSION = 1
_KEYS = ("indptr", "indices", "data", "shape", "row_source")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True, eq=False)
class Projection:
    """A student->teacher projection: ``proj_VsVt`` (CSR float32, rows sum to 1 or are empty)."""

    proj_VsVt: sp.csr_matrix
    row_source_Vs: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(int(x) for x in self.proj_VsVt.shape)

    def row(self, s: int) -> dict[int, float]:
        """Teacher id -> weight for student token ``s``."""
        m = self.proj_VsVt
        lo, hi = m.indptr[s], m.indptr[s + 1]
        return {int(t): float(w) for t, w in zip(m.indices[lo:hi], m.data[lo:hi])}

    def topk_arrays(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense ``[Vs, k]`` teacher ids (int64, -1 = none) and weights (float32, 0 = none): each
        row's ``k`` largest weights, largest first."""
        m = self.proj_VsVt
        n_Vs = np.diff(m.indptr)
        ids_VsK = np.full((m.shape[0], k), -1, dtype=np.int64)
        w_VsK = np.zeros((m.shape[0], k), dtype=np.float32)
        rows = np.repeat(np.arange(m.shape[0]), n_Vs)
        # each row's entries by weight, largest first (ties: the smaller teacher id)
        order = np.lexsort((m.indices, -m.data, rows))
        pos = np.arange(m.nnz) - np.repeat(m.indptr[:-1], n_Vs)
        keep = pos < k
        ids_VsK[rows[keep], pos[keep]] = m.indices[order][keep]
        w_VsK[rows[keep], pos[keep]] = m.data[order][keep]
        return ids_VsK, w_VsK


def sidecar_path(path: str | os.PathLike) -> Path:
    """``out.npz`` -> ``out.json``."""
    p = Path(path)
    return p.with_suffix(".json") if p.suffix == ".npz" else Path(str(p) + ".json")


def check_output(path: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse to write a projection over files that are not one (before any work): ``out.npz``
    or its sidecar ``out.json`` exists and the sidecar is not an xdistill projection sidecar, so
    ``-o results.npz`` would replace a user's ``results.json``. A previous projection at the same
    path is replaced; ``overwrite`` replaces anything."""
    path = Path(path)
    side = sidecar_path(path)
    if overwrite or not (path.exists() or side.exists()):
        return
    if not side.is_file():
        raise ProjectionError(f"output {str(path)!r} exists and has no projection sidecar "
                              f"{str(side)!r}, so it is not a projection this would replace "
                              "(pass --overwrite to replace it, or choose another -o)")
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ProjectionError(f"{str(side)!r} exists and is not an xdistill projection sidecar; "
                              f"writing {str(path)!r} would replace it (pass --overwrite to "
                              "replace it, or choose another -o)")


def _npz_bytes_members(proj: Projection) -> list[tuple[str, np.ndarray]]:
    m = proj.proj_VsVt
    return [("indptr", np.ascontiguousarray(m.indptr, dtype=np.int64)),
            ("indices", np.ascontiguousarray(m.indices, dtype=np.int32)),
            ("data", np.ascontiguousarray(m.data, dtype=np.float32)),
            ("shape", np.asarray(m.shape, dtype=np.int64)),
            ("row_source", np.ascontiguousarray(proj.row_source_Vs, dtype=np.int8))]


def save_projection(proj: Projection, path: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``path`` (.npz) and its sidecar deterministically (a missing folder is created);
    returns both paths. Metadata JSON cannot hold is refused before either file is replaced."""
    path = Path(path)
    _sidecar_text(proj.meta)      # fails here, with the previous pair intact
    side = sidecar_path(path)
    for target in (path, side):
        if target.is_dir():
            raise ProjectionError(f"cannot write projection {str(path)!r}: {str(target)!r} is "
                                  "a folder")
    tmp = path.with_name(path.name + ".tmp")
    side_tmp = side.with_name(side.name + ".tmp")
    try:    # both files complete beside the old pair before either is replaced
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_npz(proj, tmp)
        meta = dict(proj.meta)
        meta["npz_sha256"] = _sha256(tmp)
        side_tmp.write_text(_sidecar_text(meta))
        os.replace(tmp, path)
        os.replace(side_tmp, side)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)
        raise ProjectionError(f"writing projection {str(path)!r} failed: "
                              f"{exc.strerror or exc}") from None
    return path, side


def _write_npz(proj: Projection, tmp: Path) -> None:
    """The deterministic .npz (fixed member dates and modes) of ``proj`` at ``tmp``."""
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, arr in _npz_bytes_members(proj):
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, arr, allow_pickle=False)


def _sidecar_text(meta: dict) -> str:
    """The sidecar's JSON (numpy scalars and arrays, paths written as their plain values)."""
    def plain(value):
        if isinstance(value, np.generic | np.ndarray):
            return value.tolist()
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        raise TypeError(f"{type(value).__name__}")
    try:
        return json.dumps(meta, indent=2, sort_keys=True, default=plain) + "\n"
    except (TypeError, ValueError) as exc:
        raise ProjectionError(f"projection metadata cannot be written as JSON ({exc}); "
                              "nothing was written") from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in _KEYS if k not in npz.files]
            if missing:
                raise ProjectionError(
                    f"{path}: not an xdistill projection: missing arrays {missing} "
                    f"(found {sorted(npz.files)}; expected {list(_KEYS)})")
            return {k: npz[k] for k in _KEYS}
    except ProjectionError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as exc:
        raise ProjectionError(f"{path}: not a readable .npz (truncated or corrupt?): {exc}") from exc
    except Exception as exc:  # zlib.error and friends from a truncated member
        raise ProjectionError(f"{path}: corrupt .npz ({type(exc).__name__}: {exc})") from exc


def _validate_csr(path: Path, a: dict[str, np.ndarray]) -> sp.csr_matrix:
    shape = a["shape"]
    if shape.shape != (2,) or np.any(shape < 0):
        raise ProjectionError(f"{path}: 'shape' must be two non-negative ints, got {shape!r}")
    n_rows, n_cols = (int(x) for x in shape)
    indptr, indices, data = a["indptr"], a["indices"], a["data"]
    if indptr.shape != (n_rows + 1,) or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise ProjectionError(f"{path}: 'indptr' must be non-decreasing, start at 0, length {n_rows + 1}")
    if indices.shape != data.shape or indptr[-1] != indices.size:
        raise ProjectionError(f"{path}: 'indices'/'data' lengths {indices.size}/{data.size} "
                              f"disagree with indptr[-1]={int(indptr[-1])}")
    if indices.size and (indices.min() < 0 or indices.max() >= n_cols):
        raise ProjectionError(f"{path}: column index outside [0, {n_cols})")
    if not np.all(np.isfinite(data)) or np.any(data < 0):
        raise ProjectionError(f"{path}: weights must be finite and non-negative")
    if a["row_source"].shape != (n_rows,):
        raise ProjectionError(f"{path}: 'row_source' has shape {a['row_source'].shape}, expected ({n_rows},)")
    return sp.csr_matrix((data.astype(np.float32), indices.astype(np.int32), indptr.astype(np.int64)),
                         shape=(n_rows, n_cols))


def _check_sidecar(side: Path, meta: dict) -> None:
    """The sidecar's layout version, direction and tokenizer entries, before they are used."""
    if meta.get("format_version") != FORMAT_VERSION:
        raise ProjectionError(f"{side}: format_version {meta.get('format_version')!r}, but this "
                              f"xdistill reads version {FORMAT_VERSION}; rebuild the projection "
                              "with `xdistill projection build`")
    if meta.get("direction") != DIRECTION:
        raise ProjectionError(f"{side}: direction {meta.get('direction')!r}, expected "
                              f"{DIRECTION!r} (rows over teacher ids)")
    for role in ("student", "teacher"):
        entry = meta.get(role)
        if not isinstance(entry, dict):
            raise ProjectionError(f"{side}: no {role!r} entry (its tokenizer's name, fingerprint "
                                  "and vocab_size); rebuild with `xdistill projection build`")
        size = entry.get("vocab_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProjectionError(f"{side}: {role}.vocab_size must be a non-negative integer, "
                                  f"got {size!r}")


def _describe(tok_meta: dict) -> str:
    return f"{tok_meta.get('name')!r} (fingerprint {str(tok_meta.get('fingerprint'))[:16]})"


def _check_pair(path: Path, meta: dict, student, teacher) -> None:
    built = {"student": meta.get("student", {}), "teacher": meta.get("teacher", {})}
    using = {"student": student, "teacher": teacher}
    bad = [side for side, tok in using.items()
           if tok is not None and built[side].get("fingerprint") != tok.fingerprint]
    if not bad:
        return
    now = {side: {"name": getattr(tok, "name", "?"), "fingerprint": getattr(tok, "fingerprint", "?")}
           for side, tok in using.items() if tok is not None}
    msg = (f"{path} was built for student {_describe(built['student'])} and teacher "
           f"{_describe(built['teacher'])}, but the {' and '.join(bad)} in use "
           + ("are " if len(bad) > 1 else "is ")
           + ", ".join(f"{side} {_describe(now[side])}" for side in bad)
           + "; rebuild it with `xdistill projection build`")
    if (student is not None and teacher is not None
            and built["student"].get("fingerprint") == teacher.fingerprint
            and built["teacher"].get("fingerprint") == student.fingerprint):
        msg += " (student and teacher look swapped)"
    raise ProjectionError(msg)


def load_projection(path: str | os.PathLike, student=None, teacher=None) -> Projection:
    """Load and validate ``path`` (+ sidecar); refuse it if built for other tokenizers.

    ``student``/``teacher`` are tokenizers (anything with ``.fingerprint``, ``.name``,
    ``.vocab_size``) or None to skip that check.
    """
    path = Path(path)
    if not path.is_file():
        raise ProjectionError(f"projection file {path} does not exist")
    side = sidecar_path(path)
    if not side.is_file():
        raise ProjectionError(f"{path}: sidecar {side} is missing (it holds the tokenizer "
                              "fingerprints; rebuild with `xdistill projection build`)")
    try:
        meta = json.loads(side.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProjectionError(f"{side}: not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ProjectionError(f"{side}: not an xdistill projection sidecar (format != {FORMAT!r})")
    _check_sidecar(side, meta)
    arrays = _read_arrays(path)
    matrix = _validate_csr(path, arrays)
    if meta.get("npz_sha256") != _sha256(path):
        raise ProjectionError(f"{path}: contents do not match the SHA-256 in its sidecar {side} "
                              "(file modified, or sidecar from another build)")
    _check_pair(path, meta, student, teacher)
    expect = (int(meta["student"]["vocab_size"]), int(meta["teacher"]["vocab_size"]))
    for label, tok, size in (("student", student, matrix.shape[0]), ("teacher", teacher, matrix.shape[1])):
        if tok is not None and tok.vocab_size != size:
            raise ProjectionError(f"{path}: matrix has {size} {label} ids but {label} "
                                  f"{tok.name!r} has vocab_size {tok.vocab_size}")
    if matrix.shape != expect:
        raise ProjectionError(f"{path}: matrix shape {matrix.shape} disagrees with sidecar vocab sizes {expect}")
    return Projection(matrix, arrays["row_source"].astype(np.int8), meta)
