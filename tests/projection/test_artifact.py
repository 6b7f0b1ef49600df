"""Artifact round trip, determinism and every refusal of load_projection (synthetic tables)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from projection_helpers import TableTok, random_table, synthetic_pair
from xdistill.errors import ProjectionError
from xdistill.projection import BuildConfig, build_projection, load_projection, save_projection, sidecar_path


@pytest.fixture
def built(tmp_path):
    student, teacher = synthetic_pair()
    proj = build_projection(student, teacher, BuildConfig(methods=("exact",)))
    path, side = save_projection(proj, tmp_path / "p.npz")
    return student, teacher, proj, path, side


def test_round_trip(built):
    student, teacher, proj, path, side = built
    assert side == sidecar_path(path) == path.with_suffix(".json")
    back = load_projection(path, student, teacher)
    assert (back.proj_VsVt != proj.proj_VsVt).nnz == 0
    np.testing.assert_array_equal(back.row_source_Vs, proj.row_source_Vs)
    meta = json.loads(side.read_text())
    assert meta["student"]["fingerprint"] == student.fingerprint
    assert meta["teacher"]["vocab_size"] == teacher.vocab_size
    assert meta["direction"] == "student_to_teacher" and meta["top_k"] == 4
    assert meta["xdistill_version"] and meta["coverage"]["nnz"] == proj.proj_VsVt.nnz
    ids, w = back.topk_arrays(2)
    assert ids.shape == (student.vocab_size, 2) and ids[2, 0] == 2 and w[2, 0] == 1.0 and ids[6, 0] == -1


def test_rebuild_is_byte_identical(tmp_path):
    rng = np.random.default_rng(3)
    s = TableTok(random_table(rng, 3000, max_len=3), "rs", "1" * 64)
    t = TableTok(random_table(rng, 2000, max_len=3), "rt", "2" * 64)
    blobs = []
    for i in range(2):
        proj = build_projection(s, t, BuildConfig(methods=("exact",), top_k=2))
        path, side = save_projection(proj, tmp_path / f"r{i}.npz")
        blobs.append((path.read_bytes(), side.read_text()))
    assert blobs[0][0] == blobs[1][0]
    with zipfile.ZipFile(tmp_path / "r0.npz") as zf:
        assert [i.date_time for i in zf.infolist()] == [(1980, 1, 1, 0, 0, 0)] * 5


def test_fingerprint_mismatch_names_both(built):
    student, teacher, _, path, _ = built
    other = TableTok(student.table, "other-student", "9" * 64)
    with pytest.raises(ProjectionError) as err:
        load_projection(path, other, teacher)
    msg = str(err.value)
    assert "'syn-s'" in msg and "'other-student'" in msg and "ffffffff" in msg and "99999999" in msg
    with pytest.raises(ProjectionError, match="swapped"):
        load_projection(path, TableTok(teacher.table, "t", teacher.fingerprint),
                        TableTok(student.table, "s", student.fingerprint))


def test_missing_file_and_sidecar(built, tmp_path):
    _, _, _, path, side = built
    with pytest.raises(ProjectionError, match="does not exist"):
        load_projection(tmp_path / "nope.npz")
    side.unlink()
    with pytest.raises(ProjectionError, match=r"sidecar .*p\.json is missing"):
        load_projection(path)


def test_not_an_npz(built):
    _, _, _, path, _ = built
    path.write_text("hello, I am not a zip file\n")
    with pytest.raises(ProjectionError, match="not a readable .npz"):
        load_projection(path)


def test_truncated_npz(built):
    _, _, _, path, _ = built
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProjectionError, match="truncated or corrupt"):
        load_projection(path)


def test_wrong_keys(built):
    _, _, _, path, _ = built
    np.savez(path.with_suffix(""), weights=np.ones(3))  # writes p.npz
    with pytest.raises(ProjectionError, match=r"missing arrays \['indptr'.*found \['weights'\]"):
        load_projection(path)


def test_modified_npz_vs_sidecar(built, tmp_path):
    student, teacher, proj, path, side = built
    meta = json.loads(side.read_text())
    meta["npz_sha256"] = "0" * 64
    side.write_text(json.dumps(meta))
    with pytest.raises(ProjectionError, match="SHA-256"):
        load_projection(path)


def test_shape_vs_vocab_mismatch(built):
    student, teacher, _, path, _ = built
    bigger = TableTok(random_table(np.random.default_rng(0), 50), "syn-t", teacher.fingerprint)
    with pytest.raises(ProjectionError, match="8 teacher ids but teacher 'syn-t' has vocab_size 50"):
        load_projection(path, student, bigger)


def test_bad_csr_contents(built):
    _, _, proj, path, side = built
    m = proj.proj_VsVt
    indices = m.indices.copy()
    indices[0] = 10_000
    with zipfile.ZipFile(path, "w") as zf:
        for name, arr in (("indptr", m.indptr), ("indices", indices), ("data", m.data),
                          ("shape", np.array(m.shape)), ("row_source", proj.row_source_Vs)):
            with zf.open(name + ".npy", "w") as fh:
                np.lib.format.write_array(fh, np.asarray(arr))
    with pytest.raises(ProjectionError, match="column index outside"):
        load_projection(path)
