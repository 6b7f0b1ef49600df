"""Bad input gives a clear AlignmentError (never a crash or silent garbage); compile cache."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from align_helpers import Vocab, segment
from xdistill.align import align_batch, align_pair
from xdistill.errors import AlignmentError


@pytest.fixture(scope="module")
def setup():
    vocab = Vocab()
    s = segment(vocab, b"hello world", [5])
    t = segment(vocab, b"hello world", [2, 6])
    return vocab.table(), s, t


def _batch(s, t):
    return np.array([s]), np.array([len(s)]), np.array([t]), np.array([len(t)])


@pytest.mark.parametrize("change,match", [
    (lambda a: a.__setitem__(0, a[0] * 0 + [[0, 10**6]]),
     r"student row 0, token 1: id 1000000 outside"),
    (lambda a: a.__setitem__(0, a[0] * 0 - 1), r"student row 0, token 0: id -1 outside"),
    (lambda a: a.__setitem__(1, np.array([-1])), r"student row 0: length -1 outside \[0, 2\]"),
    (lambda a: a.__setitem__(3, np.array([9])), r"teacher row 0: length 9 outside \[0, 3\]"),
    (lambda a: a.__setitem__(0, a[0].astype(np.float32)), r"s_ids_BTs must be an integer array"),
    (lambda a: a.__setitem__(2, a[2][0]), r"t_ids_BTt must be 2-D"),
    (lambda a: a.__setitem__(3, np.array([3, 3])), r"t_len_B has 2 entries for 1 teacher rows"),
    (lambda a: a.__setitem__(2, np.concatenate([a[2], a[2]])), r"t_len_B has 1 entries for 2"),
])
def test_bad_arrays(setup, change, match):
    table, s, t = setup
    args = list(_batch(s, t))
    change(args)
    with pytest.raises(AlignmentError, match=match):
        align_batch(*args, table, table)


def test_bad_options_tables_and_phantoms(setup):
    table, s, t = setup
    with pytest.raises(AlignmentError, match="chunks must be one of"):
        align_pair(s, t, table, table, chunks="words")
    with pytest.raises(AlignmentError, match="method must be one of"):
        align_pair(s, t, table, table, method="fast")
    with pytest.raises(AlignmentError, match="t_table must be a TokenByteTable"):
        align_pair(s, t, table, {"not": "a table"})
    with pytest.raises(AlignmentError, match="s_phantom_B\\[0\\] = -2 is negative"):
        align_pair(s, t, table, table, s_phantom=-2)
    with pytest.raises(AlignmentError, match="teacher row 0: phantom prefix of 99 bytes"):
        align_pair(s, t, table, table, t_phantom=99)
    with pytest.raises(AlignmentError, match="s_ids_BTs must be 2-D"):
        align_batch(np.array(s), np.array([2]), np.array([t]), np.array([3]), table, table)


def test_ids_from_another_tokenizer_are_caught(setup):
    table, s, t = setup
    small = Vocab()
    segment(small, b"ab", [])
    with pytest.raises(AlignmentError, match="different tokenizers"):
        align_pair(s, t, small.table(), table)


def test_method_exact_on_different_texts_names_the_row_and_byte(setup):
    table, s, t = setup
    vocab = Vocab()
    s2 = segment(vocab, b"hello world", [5])
    t2 = segment(vocab, b"hello there", [5])
    tab = vocab.table()
    with pytest.raises(AlignmentError, match=r"row 0: method='exact'.*byte 6"):
        align_pair(s2, t2, tab, tab, method="exact")


def test_padding_values_are_never_read(setup):
    table, s, t = setup
    s_ids = np.array([s + [-7, 10**9]])
    t_ids = np.array([t + [2**40]])
    res = align_batch(s_ids, np.array([len(s)]), t_ids, np.array([len(t)]), table, table,
                      s_phantom_B=[0], t_phantom_B=np.array([0], np.uint8))
    assert res.s_chunk_BTs[0].tolist()[-2:] == [-1, -1] and res.t_chunk_BTt[0][-1] == -1
    assert res.s_coverage_B[0] == 1.0


def test_empty_rows_and_empty_batch(setup):
    table, s, t = setup
    res = align_batch(np.zeros((2, 0), np.int64), np.zeros(2, np.int64), np.zeros((2, 0), int),
                      np.zeros(2, np.int32), table, table)
    assert res.n_chunks_B.tolist() == [0, 0] and res.chunk_valid_BC.shape == (2, 0)
    assert res.s_coverage_B.tolist() == [1.0, 1.0]
    res = align_pair([], t, table, table)
    assert res.t_coverage_B[0] == 0.0 and res.n_chunks_B[0] == 0
    empty = align_batch(np.zeros((0, 4), int), np.zeros(0, int), np.zeros((0, 4), int),
                        np.zeros(0, int), table, table)
    assert empty.n_chunks_B.shape == (0,)


def test_dp_gap_too_big_is_left_unaligned_with_a_warning():
    vocab = Vocab()
    s = segment(vocab, b"hello world", [5])
    t = segment(vocab, b"hello there", [5])
    table = vocab.table()
    with pytest.warns(RuntimeWarning, match=r"rows \[0\] have regions left unaligned"):
        res = align_pair(s, t, table, table, method="dp", dp_max_cells=4)
    # the common prefix "hello " needs no DP; the gap "world" / "there" exceeds the cap
    assert res.s_chunk_BTs[0].tolist() == [0, -1] and res.used_dp_B[0]


def test_fresh_process_loads_the_compiled_kernel_from_the_cache(setup):
    """The numba cache is keyed on all kernel sources and a new process does not recompile."""
    from xdistill.align import _batch

    table, s, t = setup
    align_pair(s, t, table, table)                     # compiles or loads, and writes the cache
    stamp = _batch.align_kernel._cache._cache_file._source_stamp
    assert stamp[1] == _batch.kernel_sources_stamp()
    code = ("from xdistill.align import align_pair, _batch\n"
            "from xdistill.tokenization.table import TokenByteTable as T\n"
            "tab = T.from_bytes_list([b'a', b'b'])\n"
            "align_pair([0, 1], [0, 1], tab, tab)\n"
            "st = _batch.align_kernel.stats\n"
            "print(len(st.cache_hits), len(st.cache_misses))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["1", "0"], out


def test_set_align_threads_caps_numba_pool(get_tokenizer):
    import numba

    from xdistill.align import align_pair, set_align_threads
    from xdistill.align import api
    from xdistill.align._batch import align_kernel, align_kernel_serial

    before = numba.get_num_threads()
    try:
        assert set_align_threads(10_000) == numba.config.NUMBA_NUM_THREADS
        assert set_align_threads(0) == 1  # clamped to at least one thread
        assert set_align_threads(1) == 1
        assert api._kernel() is align_kernel_serial  # one thread: no threading layer at all
        if numba.config.NUMBA_NUM_THREADS >= 2:
            assert set_align_threads(2) == 2
            tok = get_tokenizer("gpt2")
            ids = tok.encode("capped threads", add_special_tokens=False).ids
            numba.set_num_threads(1)
            align_pair(ids, ids, tok.table, tok.table)  # the cap is applied where alignment runs
            assert numba.get_num_threads() == 2
            assert api._kernel() is align_kernel
    finally:
        api._THREAD_CAP[0] = 0
        numba.set_num_threads(before)


_FORK_SCRIPT = """
import sys, numpy as np, torch
from torch.utils.data import DataLoader, Dataset
from xdistill.tokenization.table import TokenByteTable
from xdistill.align import align_batch

table = TokenByteTable.from_bytes_list([bytes([i]) for i in range(256)] + [b"ab", b"abc"])

class Rows(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        s = np.random.default_rng(i).integers(0, 256, size=(8, 32))
        return int(align_batch(s, np.full(8, 32), s.copy(), np.full(8, 32), table,
                               table).n_chunks_B.sum())

torch.set_num_threads(2)
a = torch.randn(512, 512)
(a @ a).sum()                      # torch's OpenMP pool now runs in the parent
if sys.argv[1] == "parent-aligns":  # numba's threading layer too
    s = np.zeros((4, 3), np.int64)
    align_batch(s, np.full(4, 3), s, np.full(4, 3), table, table)
print(int(sum(b.sum() for b in DataLoader(Rows(), batch_size=2, num_workers=1))))
"""


@pytest.mark.parametrize("mode", ["parent-aligns", "parent-idle"])
def test_forked_loader_worker_aligns_after_parent_ran_openmp(mode, tmp_path):
    """Regression: a forked data-loader worker waited forever in the aligner's parallel region
    once the parent's torch had run OpenMP (GNU OpenMP is not fork-safe). Two threads, no
    OMP_NUM_THREADS, as users run it. One deadline for the whole child (the subprocess timeout):
    a per-batch loader timeout of 120 s failed both cases once under a load of ~6 on 2 cores,
    where the child's imports alone take minutes; the hang it guards against is forever."""
    import subprocess
    import sys

    script = tmp_path / "fork.py"
    script.write_text(_FORK_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER")}
    out = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == str(4 * 8 * 32)


def test_kernels_cached_is_false_on_an_empty_numba_cache(tmp_path):
    """The trainer says the first batch compiles the aligner (~30 s) when this is False."""
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
        filter(None, [repo, os.environ.get("PYTHONPATH")])))
    code = "from xdistill.align.api import kernels_cached; print(kernels_cached())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_compile_kernels_is_a_no_op_once_they_are_cached():
    """``make test`` compiles both kernels first (a no-op there when already cached); asking
    again compiles nothing, and both stay cached."""
    from xdistill.align.api import compile_kernels, kernels_cached

    compile_kernels()   # compiles only under plain pytest on a fresh install
    assert kernels_cached() and compile_kernels() is False
