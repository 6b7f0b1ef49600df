"""The :class:`Tokenizer` wrapper: an HF fast tokenizer plus its token-bytes table and fingerprint.

It also carries the special-token roles and the lossy flag, and encodes with byte offsets.

Legend: ``V`` vocabulary size (covers every id the tokenizer can produce), ``T`` tokens.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata

import numpy as np

from xdistill.errors import TokenizerError
from xdistill.tokenization.bos import model_add_bos
from xdistill.tokenization.bytes import build_table_arrays, detect_family, walk_types
from xdistill.tokenization.encode import (Encoding, char_to_byte_map, hf_byte_offsets,
                                          place_tokens_phantoms)
from xdistill.tokenization.fingerprint import fingerprint
from xdistill.tokenization.roles import role_tokens, roles_array
from xdistill.tokenization.table import ROLE_NAMES, ROLE_TEXT, TokenByteTable, bytes_without_token


def _id_to_token(spec: dict) -> dict[int, str]:
    """id -> token string from ``tokenizer.json`` (model vocabulary, then added tokens)."""
    vocab = (spec.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        out = {int(i): tok for tok, i in vocab.items()}
    elif isinstance(vocab, list):                       # Unigram: [[piece, score], ...]
        out = {i: entry[0] for i, entry in enumerate(vocab)}
    else:
        out = {}
    for tok in spec.get("added_tokens") or []:
        out[int(tok["id"])] = tok["content"]
    return out


def _lossless_normalizer(norm, family: str) -> bool:
    """Whether a ``tokenizer.json`` normaliser keeps text recoverable from the token bytes. Only a
    known list is: none, NFC (exact on NFC text, see ``Tokenizer.nfc``) and, for SentencePiece
    families (whose tables read ``▁`` as a space and whose phantom spaces :mod:`.encode` places),
    ``Prepend("▁")`` and ``Replace(" " -> "▁")``; a ``Sequence`` of those. Anything else
    (lowercasing, NFKC, precompiled charsmaps, ``Nmt``, other replacements, ...) is lossy."""
    if norm is None:
        return True
    if not isinstance(norm, dict):
        return False
    kind, spm = norm.get("type"), family in ("spm", "unigram")
    if kind == "Sequence":
        return all(_lossless_normalizer(n, family) for n in norm.get("normalizers") or [])
    if kind == "NFC":
        return True
    if kind == "Prepend":
        return spm and norm.get("prepend") == "\u2581"
    if kind == "Replace":
        return spm and norm.get("pattern") == {"String": " "} and norm.get("content") == "\u2581"
    return False


def prepends_per_piece(spec: dict) -> bool:
    """Whether a ``▁`` is put before *every* piece of text between added tokens (a ``Prepend``
    normaliser, Phi-3; a Metaspace pre-tokeniser with ``prepend_scheme`` ``always``), not only
    before the text's start."""
    if any(True for _ in walk_types(spec.get("normalizer"), "Prepend")):
        return True
    return any(m.get("prepend_scheme", "always" if m.get("add_prefix_space") else "never")
               == "always" for m in walk_types(spec.get("pre_tokenizer"), "Metaspace"))


def is_lossy(spec: dict, family: str) -> bool:
    """True when encoded text cannot be recovered byte-for-byte from the token bytes.

    WordPiece always (whitespace is dropped); any normaliser not known to be lossless
    (:func:`_lossless_normalizer`); and SentencePiece / Unigram models without byte fallback
    (unknown characters become ``<unk>``). NFC is *not* counted as lossy: such tokenizers are
    exact on NFC text.
    """
    if family == "wordpiece":
        return True
    if not _lossless_normalizer(spec.get("normalizer"), family):
        return True
    if family in ("spm", "unigram") and not (spec.get("model") or {}).get("byte_fallback"):
        return True
    return False


def padding_id(tok) -> int:
    """The id that pads ``tok``'s rows: its pad token, else its end-of-sequence token, else 0
    (any object with ``pad_id`` / ``eos_id``)."""
    for pid in (tok.pad_id, tok.eos_id):
        if pid is not None:
            return int(pid)
    return 0


def _plain_copy(serialised: str):
    """A Rust tokenizer from its JSON, padding and truncation off (encode() never pads or cuts)."""
    # deferred: tokenizers (xdistill.tokenization stays numpy-only)
    from tokenizers import Tokenizer as RustTokenizer

    backend = RustTokenizer.from_str(serialised)
    backend.no_padding()
    backend.no_truncation()
    return backend


class Tokenizer:
    """A loaded tokenizer (use :func:`xdistill.tokenization.load_tokenizer`)."""

    def __init__(self, hf, name: str, source: str):
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError(f"{source}: not a fast (tokenizers-backed) tokenizer")
        self.hf, self.name, self.source = hf, name, source
        self._shared = backend
        serialised = backend.to_str()
        self._spec = json.loads(serialised)
        self.family = detect_family(self._spec, source)
        self.lossy = is_lossy(self._spec, self.family)
        #: the normaliser applies NFC: exact on NFC text (nearly all text); on other text the
        #: token bytes are those of the NFC form, and encode() falls back to HF's offsets.
        self.nfc = any(True for _ in walk_types(self._spec.get("normalizer"), "NFC"))
        self.table = self._build_table()
        #: non-role added tokens after which a new phantom-space segment starts (None: no
        #: per-piece ``▁``), and a regex finding their strings in a text (None: there are none)
        self._cut_V, self._cut_rx = self._piece_cuts()
        self.vocab_size = self.table.vocab_size
        self.bos_id = hf.bos_token_id
        self.eos_id = hf.eos_token_id
        self.pad_id = hf.pad_token_id
        self.unk_id = hf.unk_token_id

    def _build_table(self) -> TokenByteTable:
        id2tok = _id_to_token(self._spec)
        V = max(max(id2tok, default=-1) + 1, len(self.hf))
        tokens: list[str | None] = [None] * V
        for i, tok in id2tok.items():
            tokens[i] = tok
        holes = np.fromiter((t is None for t in tokens), dtype=bool, count=V)
        added = {int(t["id"]): (t["content"], bool(t.get("special")))
                 for t in self._spec.get("added_tokens") or []}
        declared = {a: getattr(self.hf, f"{a}_token", None) for a in ("bos", "eos", "pad", "unk")}
        special_ids = {i for i in self.hf.all_special_ids if i is not None and 0 <= i < V}
        roles = role_tokens(added, special_ids, declared, id2tok.get, self.family)
        roles_V = roles_array(V, roles, holes)
        byte_fallback = bool((self._spec.get("model") or {}).get("byte_fallback"))
        added_V = np.zeros(V, dtype=bool)
        added_V[[i for i in added if 0 <= i < V]] = True
        offsets_V1, data = build_table_arrays(tokens, self.family, holes | (roles_V != ROLE_TEXT),
                                              byte_fallback, added_V)
        missing = b"" if self.lossy else bytes_without_token(offsets_V1, data, roles_V)
        return TokenByteTable(offsets_V1, data, roles_V, self.lossy, missing)

    def _piece_cuts(self) -> tuple[np.ndarray | None, re.Pattern | None]:
        """``(cut_V, regex)`` for :attr:`_cut_V` / :attr:`_cut_rx`: the non-role added tokens of a
        tokenizer that puts ``▁`` before every piece of text (:func:`prepends_per_piece`)."""
        if not prepends_per_piece(self._spec):
            return None, None
        added = [(int(t["id"]), t["content"]) for t in self._spec.get("added_tokens") or []]
        added = [(i, c) for i, c in added if 0 <= i < self.table.vocab_size and c
                 and self.table.roles_V[i] == ROLE_TEXT]
        if not added:
            return None, None
        cut_V = np.zeros(self.table.vocab_size, dtype=bool)
        cut_V[[i for i, _ in added]] = True
        rx = re.compile("|".join(re.escape(c) for c in sorted({c for _, c in added}, key=len,
                                                                reverse=True)))
        return cut_V, rx

    @functools.cached_property
    def _present_bytes(self) -> bytes:
        """Every byte value but ``table.missing_bytes`` (a ``bytes.translate`` deletion set)."""
        return bytes(b for b in range(256) if b not in set(self.table.missing_bytes))

    @functools.cached_property
    def _bos_default(self) -> tuple[bool, str]:
        return model_add_bos(self.hf, self.source, self.bos_id)

    @property
    def add_bos_default(self) -> bool:
        """Whether this tokenizer's model starts its text with the BOS token by default
        (:mod:`xdistill.tokenization.bos`): the default of every ``add_bos`` setting."""
        return self._bos_default[0]

    @property
    def add_bos_origin(self) -> str:
        """Where :attr:`add_bos_default` was read (a config key, GGUF metadata, the tokenizer)."""
        return self._bos_default[1]

    @functools.cached_property
    def fingerprint(self) -> str:
        """Stable sha256 hex digest (see :mod:`xdistill.tokenization.fingerprint`)."""
        return fingerprint(self.family, self.table, self._spec)

    @functools.cached_property
    def _len_V(self) -> np.ndarray:
        return self.table.lengths_V

    def _wrap(self, text: str, enc) -> Encoding:
        ids_T = np.asarray(enc.ids, dtype=np.int64)
        hs_T, he_T = hf_byte_offsets(enc.offsets, char_to_byte_map(text))
        lossless = self._placeable(text)
        starts_T, ends_T, phantom, phantom_T = place_tokens_phantoms(
            ids_T, hs_T, he_T, self._len_V, self.table.roles_V, lossless=lossless,
            cut_V=self._cut_V)
        return Encoding(ids_T, starts_T, ends_T, phantom, phantom_T)

    def is_exact_on(self, text: str) -> bool:
        """True when this text's token bytes will reproduce it exactly (barring in-text special
        tokens): the tokenizer is not lossy, the text is valid UTF-8 (no lone surrogate) and NFC
        if the tokenizer applies NFC, it holds none of the table's ``missing_bytes`` (which the
        tokenizer drops), for SentencePiece no literal ``▁`` (U+2581), which SentencePiece cannot
        tell from a space, and, when a ``▁`` is put before every piece of text (Phi-3), no
        non-role added token (each one adds a phantom space after it)."""
        if not self._placeable(text):
            return False
        return self._cut_rx is None or self._cut_rx.search(text) is None

    def _placeable(self, text: str) -> bool:
        """:meth:`is_exact_on` but for added tokens: tokens may be placed from the table (each
        non-role added token starts a new phantom-space segment, see :mod:`.encode`)."""
        if self.lossy:
            return False
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return False
        if self.nfc and not unicodedata.is_normalized("NFC", text):
            return False
        if self.table.missing_bytes and \
                text.encode("utf-8", "surrogatepass").translate(None, self._present_bytes):
            return False
        return not (self.family in ("spm", "unigram") and "\u2581" in text)

    def encode(self, text: str, add_special_tokens: bool = False,
               specials_as_text: bool = False) -> Encoding:
        """Token ids with byte offsets into ``text.encode("utf-8")`` (see :mod:`.encode`).
        ``specials_as_text``: a special token's string in ``text`` is tokenized as the text it
        spells (a student may write ``<|endoftext|>`` with ordinary tokens)."""
        if not isinstance(text, str):
            raise TokenizerError(f"{self.name}: encode() needs a str, got {type(text).__name__}")
        backend = self._text_backend if specials_as_text else self._backend
        try:
            enc = backend.encode(text, add_special_tokens=add_special_tokens)
        except TypeError as exc:
            raise self._bad_text("encode() text", [text], exc) from exc
        return self._wrap(text, enc)

    def _bad_text(self, what: str, texts: list[str], exc: Exception) -> TokenizerError:
        """The error for the Rust binding's TypeError: it names the item that holds a lone
        surrogate (not UTF-8; the binding says ``TextInputSequence must be str``)."""
        for i, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                item = f"{what} {i}" if what.endswith(" item") else what
                return TokenizerError(f"{self.name}: {item} holds a lone surrogate "
                                      f"(U+{ord(text[err.start]):04X} at character {err.start}); "
                                      "expected text that is valid UTF-8")
        return TokenizerError(f"{self.name}: {what.removesuffix(' item')} failed: {exc}")

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False,
                     specials_as_text: bool = False) -> list[Encoding]:
        """:meth:`encode` for many texts (one call into the Rust tokenizer)."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TokenizerError(f"{self.name}: encode_batch() item {i} is "
                                     f"{type(text).__name__}, expected str")
        backend = self._text_backend if specials_as_text else self._backend
        try:
            encs = backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        except TypeError as exc:
            raise self._bad_text("encode_batch() item", texts, exc) from exc
        return [self._wrap(t, e) for t, e in zip(texts, encs)]

    @functools.cached_property
    def _fast_tables(self) -> tuple[list[int], frozenset[int]]:
        """Byte length per id (a Python list) and the set of role ids, for :meth:`encode_ids_batch`."""
        return self._len_V.tolist(), frozenset(np.flatnonzero(self.table.roles_V != ROLE_TEXT).tolist())

    @property
    def _backend(self):
        """The Rust tokenizer encode() uses: ``hf``'s own while it neither pads nor truncates,
        else a private copy with both off (encode() must never pad or truncate: BERT's
        tokenizer.json ships with both on, and calling the public ``hf`` with ``truncation=`` /
        ``padding=`` switches them on in its backend). A copy costs ~0.8 s for Gemma-3's
        vocabulary, so it is made only when needed."""
        shared = self._shared
        if shared.padding is None and shared.truncation is None:
            return shared
        return self._private_backend

    @functools.cached_property
    def _private_backend(self):
        return _plain_copy(self._shared.to_str())

    @functools.cached_property
    def _text_backend(self):
        """A copy of the Rust tokenizer that reads every role token's string as plain text
        (``encode_special_tokens``; role tokens an ``added_tokens`` entry marks non-special,
        as Phi-3's ``</s>``, are marked special in the copy first, or they would still match).
        A copy, so the shared one never changes mode."""
        spec = json.loads(self._backend.to_str())
        roles = self.table.roles_V
        for tok in spec.get("added_tokens") or []:
            tid = tok.get("id")
            if isinstance(tid, int) and 0 <= tid < roles.size and roles[tid] != ROLE_TEXT:
                tok["special"] = True
        model = spec.get("model") or {}
        if model.get("type") == "Unigram":
            # a Unigram model holds its control pieces (<s>, </s>, <unk>) with score 0, which
            # beats any spelling of "</s>" in text: never let the model itself pick a role id
            for tid, piece in enumerate(model.get("vocab") or []):
                if tid < roles.size and roles[tid] != ROLE_TEXT and isinstance(piece, list):
                    piece[1] = -1e9
        backend = _plain_copy(json.dumps(spec))
        backend.encode_special_tokens = True
        return backend

    def encode_ids_batch(self, texts: list[str], specials_as_text: bool = False
                         ) -> list[tuple[list[int], int]]:
        """``(ids, phantom_prefix)`` per text, as :meth:`encode_batch` (no special tokens added)
        gives them, without computing byte offsets: fast for many short texts (re-tokenizing a
        whole vocabulary). For an exact text without role tokens the phantom prefix is the
        text's token bytes minus the bytes its last token ends at (the module doc of
        :mod:`.encode`); any other text takes the full :meth:`encode_batch` path.

        ``specials_as_text``: a special token's string in the text (``</s>`` written out) is
        tokenized as the text it spells, never as the special token (which has no bytes)."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TokenizerError(f"{self.name}: encode_ids_batch() item {i} is "
                                     f"{type(text).__name__}, expected str")
        len_list, role_ids = self._fast_tables
        backend = self._text_backend if specials_as_text else self._backend
        try:
            encs = backend.encode_batch(texts, add_special_tokens=False)
        except TypeError as exc:
            raise self._bad_text("encode_ids_batch() item", texts, exc) from exc
        out: list[tuple[list[int], int]] = []
        for text, enc in zip(texts, encs):
            ids = enc.ids
            if not ids:
                out.append(([], 0))
            elif self.is_exact_on(text) and role_ids.isdisjoint(ids):
                end = enc.offsets[-1][1]
                end = end if text.isascii() else len(text[:end].encode("utf-8", "surrogatepass"))
                out.append((list(ids), max(sum(len_list[i] for i in ids) - end, 0)))
            else:
                out.append((list(ids), self._wrap(text, enc).phantom_prefix))
        return out

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        return self.table.token_bytes(token_id)

    def role_table(self) -> dict[str, list[tuple[int, str]]]:
        """``{role name: [(id, token string), ...]}`` for every role token."""
        out: dict[str, list[tuple[int, str]]] = {}
        for tid in np.flatnonzero(self.table.roles_V != ROLE_TEXT).tolist():
            role = ROLE_NAMES[int(self.table.roles_V[tid])]
            out.setdefault(role, []).append((tid, self.hf.convert_ids_to_tokens(tid)))
        return out

    def __repr__(self) -> str:
        return (f"Tokenizer(name={self.name!r}, family={self.family!r}, vocab_size={self.vocab_size}, "
                f"lossy={self.lossy})")
