"""Review of ``xdistill/projection`` and ``xdistill projection build|inspect`` (session s24).

Checked and found correct (no test here):

* compose: precedence of non-exact methods, role override, exact pin to exactly 1.0, top-k with
  ties to the smaller teacher id, float64 renormalisation stored as float32 (rows sum to 1 within
  1e-7), empty rows for unmapped tokens, int64 keys ``s * Vt + t`` without overflow for 152k vocabs;
* multitoken weights ``decay**i / sum_j decay**j`` (decay 0, repeated teacher ids), invalid UTF-8
  tokens split into segments + single-byte tokens, SentencePiece phantom-prefix fix-up;
* match_bytes / lookup_bytes / byte_token_map (NUL bytes, length buckets, duplicate teacher bytes
  ``\\u2581`` vs ``<0x20>`` resolved to the piece the teacher produces), teacher_preference with
  groups of 3+ duplicates still picks the highest id;
* byte-prefix map: root map, stop bridge, child groups / ``_successor`` ranges, whitespace mask;
* corpus: empty and whitespace-only texts, special-token strings inside corpus text (chunks with
  mismatched specials are invalid), min_count, max_texts, compaction merge;
* artifact: deterministic bytes, truncated / non-zip / wrong-keys / SHA mismatch / swapped pair
  refusals, vocab-size checks against padded model vocabularies (qwen2 table = 151936 ids);
* audit: entropy in bits, histogram bins, example rows, plot reduceat over non-empty rows.

Each test below failed before its fix (same commit) and shows one defect:

* ``test_student_text_token_spelling_a_teacher_special_keeps_its_bytes``: the multitoken method
  re-tokenizes a student *text* token whose bytes are ``</s>`` with the teacher's text encoder,
  which turns the string into the teacher's EOS special token: Qwen2's plain text token ``</s>``
  becomes a one-hot row on Llama's ``</s>`` EOS (zero bytes, role eos).
* ``test_load_refuses_a_sidecar_of_another_format_version``: ``format_version`` (and
  ``direction``) are written but never checked on load.
* ``test_sidecar_without_tokenizer_entries_is_a_projection_error``: a sidecar without its
  ``student``/``teacher`` entries raises a bare ``KeyError`` (a traceback in the CLI).
* ``test_failed_save_keeps_the_previous_projection``: ``save_projection`` replaced the ``.npz``
  before serialising the sidecar; a metadata value JSON cannot write (numpy int, ``Path``) left
  the new matrix next to the old sidecar, so the previous valid projection no longer loaded.
* ``test_topk_arrays_keeps_the_largest_weights``: ``Projection.topk_arrays(k)`` keeps the first
  ``k`` entries in *column* order, not the ``k`` largest weights.
* ``test_jsonl_corpus_that_is_not_utf8_is_a_projection_error``: a ``.jsonl`` corpus with invalid
  UTF-8 raises ``UnicodeDecodeError`` (plain-text files give a ProjectionError).
* ``test_parquet_without_text_names_its_real_columns``: the "no column 'text'" error for a parquet
  file lists ``columns: []`` instead of the file's columns.
* ``test_inspect_plot_into_a_missing_folder_is_not_a_traceback``: ``inspect --plot dir/x.png``
  with a missing folder ends in a FileNotFoundError traceback after the whole report.
* ``test_information_separators_are_not_whitespace``: audit categorises the C0 control characters
  ``\\x1c``-``\\x1f`` as "whitespace" (Python ``str.strip``), while ``\\x1b`` is "byte" and the
  byte-prefix whitespace mask (``bytes.isspace``) excludes them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from projection_helpers import synthetic_pair

from xdistill.cli import main as cli_main
from xdistill.errors import ProjectionError
from xdistill.projection import BuildConfig, build_projection, load_projection, save_projection
from xdistill.projection.artifact import SOURCE_MULTITOKEN, Projection
from xdistill.projection.audit import categorize
from xdistill.projection.corpus import iter_corpus_texts
from xdistill.tokenization.table import ROLE_TEXT


# ---------------------------------------------------------------- methods (real tokenizers)

def test_student_text_token_spelling_a_teacher_special_keeps_its_bytes(get_tokenizer):
    """Qwen2 has ordinary text tokens ``<s>``, ``</s>``, ``<unk>`` (role text, 3-5 bytes). The
    multitoken method must spell their *bytes* with teacher text tokens; it maps them onto the
    Llama/Mistral BOS/EOS/UNK specials instead (no bytes, and a text token becomes "stop")."""
    student, teacher = get_tokenizer("qwen2"), get_tokenizer("llama-spm")
    proj = build_projection(student, teacher, BuildConfig(methods=("multitoken", "exact")))
    s_tab, t_tab = student.table, teacher.table
    texts = np.flatnonzero((s_tab.roles_V == ROLE_TEXT) & (s_tab.lengths_V > 0))
    bad = []
    for literal in (b"</s>", b"<s>", b"<unk>"):
        s = next(int(i) for i in texts if s_tab.token_bytes(int(i)) == literal)
        assert proj.row_source_Vs[s] == SOURCE_MULTITOKEN
        row = proj.row(s)
        roles = {t: int(t_tab.roles_V[t]) for t in row}
        if any(r != ROLE_TEXT for r in roles.values()):
            bad.append((literal, row, roles))
    assert not bad, f"student text tokens projected onto teacher role tokens: {bad}"


# ---------------------------------------------------------------- artifact

@pytest.fixture
def saved(tmp_path):
    student, teacher = synthetic_pair()
    proj = build_projection(student, teacher, BuildConfig(methods=("exact",)))
    path, side = save_projection(proj, tmp_path / "p.npz")
    return student, teacher, path, side


def test_load_refuses_a_sidecar_of_another_format_version(saved):
    student, teacher, path, side = saved
    meta = json.loads(side.read_text())
    assert meta["format_version"] == 1
    meta["format_version"] = 2          # a future, incompatible layout
    side.write_text(json.dumps(meta))
    with pytest.raises(ProjectionError, match="version"):
        load_projection(path, student, teacher)


def test_sidecar_without_tokenizer_entries_is_a_projection_error(saved):
    _, _, path, side = saved
    meta = json.loads(side.read_text())
    del meta["student"]                 # e.g. a hand-edited or older sidecar
    side.write_text(json.dumps(meta))
    with pytest.raises(ProjectionError, match="student"):
        load_projection(path)


def test_topk_arrays_keeps_the_largest_weights():
    """Row {5: 0.1, 9: 0.9}: the top-1 teacher id is 9 (weight 0.9), not 5."""
    mat = sp.csr_matrix((np.array([0.1, 0.9], np.float32), np.array([5, 9], np.int32),
                         np.array([0, 2], np.int64)), shape=(1, 10))
    proj = Projection(mat, np.array([SOURCE_MULTITOKEN], np.int8), {})
    ids, w = proj.topk_arrays(1)
    assert ids.tolist() == [[9]] and w.tolist() == [[pytest.approx(0.9)]]


def test_failed_save_keeps_the_previous_projection(tmp_path):
    """``save_projection`` replaced ``out.npz`` first and only then serialised the sidecar: a
    metadata value JSON cannot write left the new matrix beside the old sidecar, so the previous,
    valid projection no longer loaded. Now numpy scalars and paths are written as their plain
    values, and anything else is one ProjectionError before either file changes."""
    student, teacher = synthetic_pair()
    first = build_projection(student, teacher, BuildConfig(methods=("exact",), top_k=1))
    path, side = save_projection(first, tmp_path / "p.npz")
    bad = build_projection(student, teacher, BuildConfig(
        methods=("exact",), top_k=2, extra={"opaque": object()}))
    with pytest.raises(ProjectionError, match="JSON"):
        save_projection(bad, path)
    back = load_projection(path, student, teacher)     # the old pair must be intact
    assert (back.proj_VsVt != first.proj_VsVt).nnz == 0
    second = build_projection(student, teacher, BuildConfig(
        methods=("exact",), top_k=2, extra={"corpus_bytes": np.int64(12345),
                                            "corpus": tmp_path / "c.txt"}))
    save_projection(second, path)
    meta = json.loads(side.read_text())
    assert meta["params"]["extra"] == {"corpus_bytes": 12345, "corpus": str(tmp_path / "c.txt")}
    assert (load_projection(path, student, teacher).proj_VsVt != second.proj_VsVt).nnz == 0


# ---------------------------------------------------------------- corpus readers

def test_jsonl_corpus_that_is_not_utf8_is_a_projection_error(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')   # latin-1 e-acute
    with pytest.raises(ProjectionError, match="c.jsonl"):
        list(iter_corpus_texts([path]))


def test_parquet_without_text_names_its_real_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": ["a", "b"]}), path)
    with pytest.raises(ProjectionError, match="no column 'text'") as err:
        list(iter_corpus_texts([path]))
    assert "body" in str(err.value), str(err.value)


# ---------------------------------------------------------------- CLI / audit

def test_inspect_plot_into_a_missing_folder_is_not_a_traceback(tmp_path, capsys, get_tokenizer):
    pytest.importorskip("matplotlib")
    proj = build_projection(get_tokenizer("gpt2"), get_tokenizer("bert"),
                            BuildConfig(methods=("exact",)))
    npz, _ = save_projection(proj, tmp_path / "g2b.npz")
    png = tmp_path / "figs" / "sub" / "g2b.png"
    rc = cli_main(["projection", "inspect", str(npz), "--student", "gpt2", "--teacher", "bert",
                   "--plot", str(png)])
    err = capsys.readouterr().err
    # either the folder is made (as `build -o` does) or one clear error line
    assert (rc == 0 and png.is_file()) or (rc == 2 and err.count("\n") == 1), (rc, err)


@pytest.mark.parametrize("data", [b"\x1c", b"\x1d", b"\x1e", b"\x1f"])
def test_information_separators_are_not_whitespace(data):
    """FS/GS/RS/US are C0 control characters (Unicode category Cc, not White_Space), exactly like
    ``\\x1b`` which audit calls "byte"; byte-level vocabularies hold them as single-byte tokens."""
    assert categorize(b"\x1b", ROLE_TEXT) == "byte"
    assert not data.isspace()                       # the losses' whitespace mask agrees
    assert categorize(data, ROLE_TEXT) == "byte"
