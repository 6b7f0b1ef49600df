"""Token-bytes tables: the bytes each vocabulary entry contributes to the decoded text.

Legend: ``V`` vocabulary size, ``N`` total characters/bytes of the concatenated vocabulary.

Per family (see docs/architecture.md §3):

* ``byte_bpe`` (GPT-2, Llama-3, Qwen2): token strings are written in the GPT-2 byte-to-unicode
  alphabet (``Ġ`` = 0x20, ``Ċ`` = 0x0A, ...); every character maps back to exactly one byte.
  Done vectorised: all strings are joined, read as UTF-32 code points and pushed through a lookup
  table, so Qwen2's 151,936 entries take well under a second.
* ``spm`` (SentencePiece BPE, Llama-2, Mistral, Phi-3) and ``unigram``: ``▁`` (U+2581) is a space,
  ``<0xNN>`` byte-fallback pieces are the single raw byte ``0xNN``, everything else is its UTF-8.
  The dummy-prefix space that SentencePiece adds in front of the text is a real ``▁`` in the first
  token; :class:`~xdistill.tokenization.encode.Encoding` reports it as ``phantom_prefix``.
* ``wordpiece`` (BERT): a ``##`` continuation contributes the UTF-8 of the rest; a word-initial
  token contributes its UTF-8 with **no** leading space. Whitespace between words is therefore in
  no token, and the normaliser lowercases (and may strip accents), so the table is lossy: it gives
  the normalised characters of each word piece, not the text. Alignment must use the DP path.

Tokens with a role (special/control tokens) contribute zero bytes; so do holes (ids that no token
string maps to).
"""

from __future__ import annotations

import re

import numpy as np

from xdistill.errors import TokenizerError

FAMILIES = ("byte_bpe", "spm", "wordpiece", "unigram")
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable bytes map to themselves)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _byte_lut() -> np.ndarray:
    """Code point -> byte (int16, -1 where the character is not in the GPT-2 alphabet)."""
    lut = np.full(512, -1, dtype=np.int16)
    for b, ch in bytes_to_unicode().items():
        lut[ord(ch)] = b
    return lut


_LUT = _byte_lut()


def walk_types(obj, key: str):
    """Yield every dict nested in a tokenizer.json component that has ``type == key``."""
    if isinstance(obj, dict):
        if obj.get("type") == key:
            yield obj
        for value in obj.values():
            yield from walk_types(value, key)
    elif isinstance(obj, list):
        for value in obj:
            yield from walk_types(value, key)


def detect_family(spec: dict, where: str) -> str:
    """Family of a parsed ``tokenizer.json`` (model type + pre-tokenizer/decoder conventions)."""
    model = spec.get("model") or {}
    mtype = model.get("type")
    if mtype == "WordPiece":
        return "wordpiece"
    if mtype == "Unigram":
        return "unigram"
    if mtype == "BPE":
        parts = [spec.get("pre_tokenizer"), spec.get("decoder")]
        if any(True for p in parts for _ in walk_types(p, "ByteLevel")):
            return "byte_bpe"
        if model.get("byte_fallback") or any(True for p in parts for _ in walk_types(p, "Metaspace")) \
                or "\u2581" in str(spec.get("decoder")) or "\u2581" in str(spec.get("normalizer")):
            return "spm"
        raise TokenizerError(f"{where}: BPE tokenizer uses neither byte-level nor SentencePiece "
                             "conventions; its token bytes cannot be determined")
    raise TokenizerError(f"{where}: unsupported tokenizer model type {mtype!r} "
                         f"(supported: BPE, WordPiece, Unigram)")


def _utf8_lengths(cp_N: np.ndarray) -> np.ndarray:
    return (1 + (cp_N >= 0x80) + (cp_N >= 0x800) + (cp_N >= 0x10000)).astype(np.int64)


def _codepoints(joined: str) -> np.ndarray:
    return np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _segment_sums(values_N: np.ndarray, char_len_V: np.ndarray) -> np.ndarray:
    """Sum ``values_N`` over consecutive groups of ``char_len_V`` elements (empty groups -> 0)."""
    out = np.zeros(char_len_V.size + 1, dtype=np.int64)
    np.cumsum(char_len_V, out=out[1:])
    csum = np.zeros(values_N.size + 1, dtype=np.int64)
    np.cumsum(values_N, out=csum[1:])
    return csum[out[1:]] - csum[out[:-1]]


def build_table_arrays(tokens: list[str | None], family: str, zero_mask_V: np.ndarray,
                       byte_fallback: bool, added_V: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets_V1, data)`` for id -> token string ``tokens`` (``None`` = hole).

    Ids in ``zero_mask_V`` (role tokens and holes) contribute no bytes. Ids in ``added_V`` (added
    tokens) hold raw text: in a byte-level vocabulary their bytes are their UTF-8, even when every
    character is also in the byte alphabet (``°`` there is the byte 0xB0, in ``°C`` the text).
    """
    strings = ["" if (t is None or z) else t for t, z in zip(tokens, zero_mask_V.tolist())]
    if family == "byte_bpe":
        return _byte_level(strings, added_V)
    if family == "wordpiece":
        strings = [s[2:] if s.startswith("##") else s for s in strings]
        return _utf8(strings)
    strings = [s.replace("\u2581", " ") for s in strings]
    offsets, data = _utf8(strings)
    if byte_fallback or family == "spm":
        offsets, data = _apply_byte_pieces(strings, offsets, data)
    return offsets, data


def _offsets_from_lengths(len_V: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len_V.size + 1, dtype=np.int64)
    np.cumsum(len_V, out=offsets[1:])
    return offsets


def _utf8(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    joined = "".join(strings)
    char_len = np.fromiter(map(len, strings), dtype=np.int64, count=len(strings))
    byte_len = _segment_sums(_utf8_lengths(_codepoints(joined)), char_len)
    data = np.frombuffer(joined.encode("utf-8", "surrogatepass"), dtype=np.uint8).copy()
    return _offsets_from_lengths(byte_len), data


def _byte_level(strings: list[str], raw_V: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Map GPT-2 alphabet characters back to bytes; an added token (``raw_V``) or a string with
    foreign characters (a literal word) is its UTF-8."""
    joined = "".join(strings)
    cp = _codepoints(joined)
    char_len = np.fromiter(map(len, strings), dtype=np.int64, count=len(strings))
    mapped = np.where(cp < _LUT.size, _LUT[np.minimum(cp, _LUT.size - 1)], -1)
    bad_tok = _segment_sums((mapped < 0).astype(np.int64), char_len) > 0
    if raw_V is not None:
        bad_tok |= raw_V
    if not bad_tok.any():
        return _offsets_from_lengths(char_len), mapped.astype(np.uint8)
    pieces = []
    char_off = _offsets_from_lengths(char_len)
    for i, s in enumerate(strings):
        if bad_tok[i]:
            pieces.append(s.encode("utf-8", "surrogatepass"))
        else:
            pieces.append(mapped[char_off[i]:char_off[i + 1]].astype(np.uint8).tobytes())
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    return _offsets_from_lengths(lengths), np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()


def _apply_byte_pieces(strings: list[str], offsets: np.ndarray, data: np.ndarray):
    """Replace ``<0xNN>`` pieces (6 UTF-8 bytes each) by the single byte they stand for."""
    hits = [(i, int(m.group(1), 16)) for i, s in enumerate(strings)
            if len(s) == 6 and (m := _BYTE_PIECE.match(s))]
    if not hits:
        return offsets, data
    len_V = np.diff(offsets)
    keep = np.ones(data.size, dtype=bool)
    for i, _ in hits:
        keep[offsets[i] + 1:offsets[i + 1]] = False
    for i, byte in hits:
        data[offsets[i]] = byte
        len_V[i] = 1
    return _offsets_from_lengths(len_V), data[keep].copy()
