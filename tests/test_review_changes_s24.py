"""Review of today's fixes (``git diff 4b5d368 HEAD -- xdistill/``): tests that failed before
the fixes in the same commit, one per defect (one strict xfail: a known limit).

Checked and found correct (no test here):

* ``teacher_region`` / ``encode_continuation`` / ``_literal_region`` over gpt2, qwen2, llama3,
  mistral, llama-spm, phi3, gemma3-270m, smollm2-135m; plain prompts (ending in ':', '\n', ' ')
  and each tokenizer's chat prompt; ~3,000 responses mixing spaces, '\n', '\n\n', '\t', emoji,
  'é', invalid bytes (``\xe4\xb8``, ``\xff``) and the EOS/BOS strings (not first): the region's
  bytes minus phantom bytes are exactly the response, every region token is a text token, a
  phantom byte only on a first token that straddles the prompt end (SmolLM2's unspellable bytes
  are counted in ``missing_bytes``, as documented). ``encode_continuation`` for texts starting
  with '\n', '\n\n', '\t', '#', '|', their pairs, spaces, emoji: no phantom byte, anchors that
  merge with the text fall through to the next anchor (a literal U+2581 stays the documented SP
  limitation);
* encode with ``cut_V``: a non-special added token in Phi-3 / llama-spm / mistral copies
  (``normalized: false``) places every text token on its own bytes, ``is_exact_on`` is False
  for Phi-3 texts holding it;
* fingerprints equal across folder / tokenizer.json / tiktoken / .model / GGUF where the
  configs are the same (gpt2, llama3 folder+json+tiktoken; mistral folder+json+.model;
  llama-spm and phi3 folder+json+GGUF); gpt2/llama3/qwen2 GGUFs differ in config (merges,
  pre-tokenizer, NFC) and vocabulary size, so different fingerprints are right;
* ``topk_arrays`` (lexsort by row, -weight, id keeps CSR row order), ``_check_sidecar``,
  ``_sidecar_text``; ``prompt_cut_offset`` byte starts (a template BOS dropped consistently
  with ``encode_prompts`` for add_bos true and false); the scorer's ``seen``;
  ``PromptDataset`` empty epochs (resume mid-epoch skips the check for the partial epoch only;
  shuffled shards may still draw a prompt later);
* ``agree_on_data_end``: on-policy rollout steps call it twice on every rank (inside
  ``micro_batches`` and in ``agreed_micro_batches``, also when a rank ran out: every rank then
  raises from the first call and calls the second), off-policy steps of the mix once on every
  rank (``is_offpolicy_step`` depends on config and step only); ``step_reward_norm`` calls its
  three collectives on every rank, also on off-policy steps (empty -> -inf -> None everywhere);
  ``resume_rng`` restored after ``mode.start`` (iterators made in ``start``); ``_check_mode``;
  ``_sync_point``;
* ``_read_by``'s body deadline, ``read1`` and the Content-Length check; the subprocess start
  failure and ``close`` with ``proc=None``; ``start_vllm_server``'s cleanup.

Failing tests (each a defect):

1. ``test_a_response_starting_with_a_special_string_is_read_as_text`` (gpt2, mistral, phi3,
   smollm2): a response that *starts* with a teacher special-token string (or is only one)
   is read as the control token: ``_split_at`` keeps a role token at the boundary in the
   prefix, so ``teacher_region`` sees no role token in the region and never takes the literal
   path. The region lacks the response's first bytes and the prompt gains an EOS/BOS.
2. ``test_phi3_end_of_text_string_in_a_response_is_read_as_text`` /
   ``test_specials_as_text_spells_phi3_end_of_text_string`` /
   ``test_projection_spells_a_student_text_token_that_is_phi3_end_of_text``: Phi-3's ``</s>``
   (id 2, role eos) is an added token with ``special: false``; ``_text_backend`` only sets
   ``encode_special_tokens``, which does not touch non-special added tokens, so
   ``specials_as_text=True`` still returns the byte-less id 2: in a teacher region, and in the
   projection's re-tokenization of Qwen2's text token ``</s>``.
3. ``test_timeout_s_bounds_a_try_whose_headers_or_error_body_trickle`` (200, 500): http.py
   documents ``timeout_s`` as a bound on the whole try, but only a success body is read
   against the deadline; trickled status/header lines (inside ``urlopen``) and an HTTP error
   body (``exc.read()``) are waited for per socket read: 2.8-3.3 s with ``timeout_s=1``.
4. ``test_a_folder_holding_only_a_sentencepiece_model_loads_as_that_file``: load.py routes a
   folder with only a tiktoken ``tokenizer.model`` to the file route, but a folder with only a
   SentencePiece ``tokenizer.model`` (Llama-2/Mistral ``original/``) goes to ``AutoTokenizer``,
   which builds another tokenizer from the same file: ``' hi'`` -> ``[28705, 12014]`` instead of
   ``[12014]``, no BOS by default, another fingerprint.
5. ``test_a_bare_tokenizer_json_keeps_the_folders_bos`` (bert, gpt2): the bare tokenizer.json
   route's BOS differs from its folder's (BERT: BOS ``[CLS]`` and add-BOS default true vs none;
   GPT-2: no BOS vs 50256), against the commit's "keep their BOS identity ... as the folder".
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from xdistill.rollout.teacher_text import teacher_region
from xdistill.tokenization.table import ROLE_TEXT


def _region_bytes(tok, reg) -> bytes:
    """The region's text: each token's table bytes minus its phantom bytes."""
    return b"".join(tok.table.token_bytes(int(t))[int(p):]
                    for t, p in zip(reg.ids_T.tolist(), reg.phantom_T.tolist()))


def _special(tok) -> str:
    return tok.hf.convert_ids_to_tokens(int(tok.eos_id))


# ------------------------------------------------------------------ 1. response starting with a special string
@pytest.mark.parametrize("name", ["gpt2", "mistral", "phi3", "smollm2-135m"])
@pytest.mark.parametrize("body", ["{sp} 28 apples", "{sp}"])
def test_a_response_starting_with_a_special_string_is_read_as_text(get_tokenizer, name, body):
    """From the contract: the region's tokens spell exactly the response bytes and are text
    tokens. The one-piece encoding reads the leading ``</s>`` as the control token; a role token
    right at the boundary stays in the prefix (``_split_at``), so ``teacher_region`` never sees
    a role token in the region and the literal path is not taken: the teacher reads its EOS in
    the prompt and the region lacks the response's first bytes."""
    tok = get_tokenizer(name)
    resp = body.format(sp=_special(tok)).encode()
    reg = teacher_region(tok, "Q: 3+4\nA:", resp)
    assert (tok.table.roles_V[reg.ids_T] == ROLE_TEXT).all()
    assert _region_bytes(tok, reg) == resp
    # no role token the student never wrote was added to the prompt either
    natural = tok.encode("Q: 3+4\nA:", add_special_tokens=False).ids
    assert int((tok.table.roles_V[reg.prefix_ids] != ROLE_TEXT).sum()) == \
        int((tok.table.roles_V[np.asarray(natural)] != ROLE_TEXT).sum())


# ------------------------------------------------------------------ 2. non-special added role tokens
def test_phi3_end_of_text_string_in_a_response_is_read_as_text(get_tokenizer):
    """Phi-3's ``</s>`` (id 2, role eos) is an added token with ``special: false``; the private
    text backend only sets ``encode_special_tokens``, which leaves non-special added tokens
    split out. A response that writes ``</s>`` gets the byte-less EOS in its region (bytes
    ``b'x  y'`` for ``b'x </s> y'``)."""
    tok = get_tokenizer("phi3")
    resp = b"x </s> y"
    reg = teacher_region(tok, "Q: hi\nA:", resp)
    assert (tok.table.roles_V[reg.ids_T] == ROLE_TEXT).all(), reg.ids_T.tolist()
    assert _region_bytes(tok, reg) == resp


def test_specials_as_text_spells_phi3_end_of_text_string(get_tokenizer):
    """``Tokenizer.encode(..., specials_as_text=True)`` / ``encode_ids_batch`` promise that a
    special token's string is tokenized as the text it spells, never as the byte-less special
    token; Phi-3's ``</s>`` still comes back as id 2 (zero table bytes)."""
    tok = get_tokenizer("phi3")
    enc = tok.encode("a</s>b", specials_as_text=True)
    assert 2 not in enc.ids.tolist()
    ids, phantom = tok.encode_ids_batch(["</s>"], specials_as_text=True)[0]
    assert tok.table.concat(np.asarray(ids, dtype=np.int64))[phantom:] == b"</s>", ids


def test_projection_spells_a_student_text_token_that_is_phi3_end_of_text(get_tokenizer):
    """The projection re-tokenizes Qwen2's text token ``</s>`` with a Phi-3 teacher: it must be
    spelled with teacher text tokens (commit 1015b0a), but comes back as Phi-3's EOS id 2."""
    from xdistill.projection.methods import retokenize

    student, teacher = get_tokenizer("qwen2"), get_tokenizer("phi3")
    s = int(student.hf.convert_tokens_to_ids("</s>"))
    assert student.table.token_bytes(s) == b"</s>" and student.table.roles_V[s] == ROLE_TEXT
    pieces = retokenize(student.table, np.array([s]), teacher)[0]
    assert (teacher.table.roles_V[np.asarray(pieces)] == ROLE_TEXT).all(), pieces
    assert teacher.table.concat(np.asarray(pieces, dtype=np.int64)).lstrip(b" ") == b"</s>"


# ------------------------------------------------------------------ 3. http: timeout of a whole try
def _trickle_server(chunks: list[bytes], pause_s: float):
    """A one-connection TCP server on 127.0.0.1 that reads a request and sends ``chunks`` with
    ``pause_s`` between them; returns ``(url, thread)``."""
    import socket
    import threading

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        try:
            conn.settimeout(10)
            conn.recv(65536)
            for chunk in chunks:
                conn.sendall(chunk)
                time.sleep(pause_s)
        except OSError:
            pass
        finally:
            conn.close()
            srv.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return f"http://127.0.0.1:{port}/v1/models", th



@pytest.mark.parametrize("status", [200, 500])
def test_timeout_s_bounds_a_try_whose_headers_or_error_body_trickle(status):
    """http.py: "``timeout_s`` bounds one try as a whole (connecting, waiting and reading the
    answer, however slowly it arrives)". Only the success body is read against the deadline
    (``_read_by``); ``urlopen`` reads the status line and headers with a per-read timeout, and
    an HTTP error's body is read by ``exc.read()`` without the deadline. A server sending one
    header line (200) / one body byte (500) every 0.5 s for ~6.5 s is waited for until it is done,
    with ``timeout_s=1``."""
    from xdistill.teacher.http import HttpFailure, request_json

    body = b'{"data": [{"id": "m"}]}'
    if status == 200:
        chunks = [b"HTTP/1.1 200 OK\r\n"] + [f"X-Pad-{i}: {i}\r\n".encode() for i in range(12)] \
            + [f"Content-Length: {len(body)}\r\n\r\n".encode() + body]
    else:
        err = b'{"error": {"message": "busy............"}}'
        chunks = [f"HTTP/1.1 500 Internal Server Error\r\nContent-Length: {len(err)}\r\n\r\n"
                  .encode()] + [err[i:i + 4] for i in range(0, len(err), 4)]
    url, th = _trickle_server(chunks, 0.5)     # ~6.5 s in all without a deadline
    t0 = time.monotonic()
    try:
        with pytest.raises(HttpFailure):
            request_json(url, timeout_s=1.0)
        took = time.monotonic() - t0
        # generous for a loaded machine, still well short of the whole trickle
        assert took < 4.0, f"the try took {took:.1f} s with timeout_s=1"
    finally:
        th.join(10)


# ------------------------------------------------------------------ 4. load routes
def test_a_folder_holding_only_a_sentencepiece_model_loads_as_that_file(tmp_path):
    """load.py: a tiktoken ``tokenizer.model`` alone in a folder now loads "as the file route"
    (commit c976aeb), and the bare SentencePiece ``.model`` route keeps the BOS default. The
    SentencePiece twin of that folder layout (Llama-2/Mistral ``original/``: ``tokenizer.model``
    without ``tokenizer.json`` / config) still goes to ``AutoTokenizer``, which builds another
    tokenizer from the same file: ``' hi'`` -> ``[28705, 12014]`` (an extra ``▁``) instead of
    ``[12014]``, no BOS added, and another fingerprint (a projection built with one is refused
    with the other)."""
    import shutil

    from xdistill.assets.paths import tokenizer_dir
    from xdistill.tokenization import load_tokenizer
    from xdistill.tokenization.bos import model_add_bos

    raw = tokenizer_dir("mistral").parent.parent / "raw" / "mistral.model"
    if not raw.is_file():
        pytest.skip("raw/mistral.model asset not fetched")
    folder = tmp_path / "original"
    folder.mkdir()
    shutil.copy(raw, folder / "tokenizer.model")
    by_file, by_folder = load_tokenizer(raw), load_tokenizer(folder)
    for text in (" hi", "x  y", "Hello world"):
        assert by_folder.encode(text).ids.tolist() == by_file.encode(text).ids.tolist(), text
    assert model_add_bos(by_folder.hf, by_folder.source, by_folder.bos_id)[0] == \
        model_add_bos(by_file.hf, by_file.source, by_file.bos_id)[0]
    assert by_folder.fingerprint == by_file.fingerprint


@pytest.mark.parametrize("name", ["bert", pytest.param("gpt2", marks=pytest.mark.xfail(
    strict=True, reason="known, not fixed: GPT-2's BOS (<|endoftext|>, also its EOS) is named "
    "only by tokenizer_config.json; a bare tokenizer.json cannot tell, so bos_id stays None "
    "and an explicit add_bos: true is a clear ConfigError"))])
def test_a_bare_tokenizer_json_keeps_the_folders_bos(tmp_path, name):
    """Commit c976aeb: "a bare tokenizer.json keep[s] their BOS identity and default as the
    folder ... do(es)". ``_json_roles`` names a BOS only when exactly one special added token
    has that role by its name: BERT's bare file gets BOS ``[CLS]`` (101) and adds it by default,
    where its folder has no BOS and adds none; GPT-2's bare file has no BOS where its folder's is
    ``<|endoftext|>`` (50256), so ``rollout.add_bos: true`` fails for the bare file only."""
    import shutil

    from xdistill.assets.paths import tokenizer_dir
    from xdistill.tokenization import load_tokenizer
    from xdistill.tokenization.bos import model_add_bos

    folder = tokenizer_dir(name)
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(folder / "tokenizer.json", bare / "tokenizer.json")
    by_folder, by_file = load_tokenizer(folder), load_tokenizer(bare / "tokenizer.json")
    assert by_file.fingerprint == by_folder.fingerprint       # passes: same table and config
    assert (by_file.bos_id, model_add_bos(by_file.hf, by_file.source, by_file.bos_id)[0]) == \
        (by_folder.bos_id, model_add_bos(by_folder.hf, by_folder.source, by_folder.bos_id)[0])
