"""Stable tokenizer fingerprints.

``sha256`` over a canonical description of everything that decides how text becomes ids and how
ids become bytes:

1. the family, vocabulary size and lossy flag;
2. the token-bytes table (``offsets_V1`` and ``data``, little-endian) and the roles (int8);
3. ``tokenizer.json`` without the vocabulary: the model type, merges and model options,
   normaliser, pre-tokeniser, post-processor, decoder and the added tokens, serialised as JSON
   with sorted keys. Padding and truncation settings are left out.
4. the vocabulary (token string -> id, or a Unigram model's ``[piece, score]`` list: the table
   of 2. does not cover which id a string gets, WordPiece's ``ing`` vs ``##ing``, nor the piece
   scores that decide a Unigram segmentation), as bytes (:func:`vocab_blob`).

Each part is length-prefixed so that no two different inputs hash alike by concatenation. The
result does not depend on the process, the path the tokenizer was loaded from or dict order.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from xdistill.tokenization.table import TokenByteTable

FINGERPRINT_VERSION = 2     # 2: the model vocabulary is hashed too


def canonical_config(spec: dict) -> dict:
    """``tokenizer.json`` without fields that do not change ids (padding, truncation) and without
    the vocabulary (hashed on its own: :func:`vocab_blob`)."""
    model = {k: v for k, v in (spec.get("model") or {}).items() if k != "vocab"}
    added = sorted(
        ({"id": t.get("id"), "content": t.get("content"), "special": bool(t.get("special")),
          "normalized": bool(t.get("normalized")), "lstrip": bool(t.get("lstrip")),
          "rstrip": bool(t.get("rstrip")), "single_word": bool(t.get("single_word"))}
         for t in spec.get("added_tokens") or []), key=lambda t: (t["id"], t["content"]))
    return {"model": model, "normalizer": spec.get("normalizer"),
            "pre_tokenizer": spec.get("pre_tokenizer"), "post_processor": spec.get("post_processor"),
            "decoder": spec.get("decoder"), "added_tokens": added}


def vocab_blob(vocab) -> bytes:
    """The model vocabulary as bytes: a ``{token: id}`` dict as its tokens in id order (NUL-
    separated) and the ids; a Unigram ``[[piece, score], ...]`` list as its pieces and float64
    scores. (A sorted-key JSON dump of a 262k-entry vocabulary took ~0.6 s.)"""
    if isinstance(vocab, dict):
        tokens = list(vocab)
        ids = np.fromiter((int(vocab[t]) for t in tokens), dtype="<i8", count=len(tokens))
        order = np.argsort(ids, kind="stable")
        text = "\x00".join(tokens[i] for i in order.tolist())
        return b"dict" + text.encode("utf-8", "surrogatepass") + b"\x00\x00" + ids[order].tobytes()
    if isinstance(vocab, list):
        pieces = "\x00".join(str(entry[0]) for entry in vocab)
        scores = np.array([float(entry[1]) for entry in vocab], dtype="<f8")
        return b"list" + pieces.encode("utf-8", "surrogatepass") + b"\x00\x00" + scores.tobytes()
    return b"none" if vocab is None else json.dumps(vocab, sort_keys=True).encode()


def fingerprint(family: str, table: TokenByteTable, spec: dict) -> str:
    """Hex sha256 fingerprint (see the module docstring)."""
    h = hashlib.sha256()

    def part(blob: bytes) -> None:
        h.update(len(blob).to_bytes(8, "little"))
        h.update(blob)

    header = {"v": FINGERPRINT_VERSION, "family": family, "vocab_size": table.vocab_size,
              "lossy": bool(table.lossy)}
    part(json.dumps(header, sort_keys=True).encode())
    part(table.offsets_V1.astype("<i8", copy=False).tobytes())
    part(np.ascontiguousarray(table.data).tobytes())
    part(table.roles_V.astype(np.int8, copy=False).tobytes())
    part(json.dumps(canonical_config(spec), sort_keys=True, ensure_ascii=False,
                    separators=(",", ":")).encode("utf-8"))
    part(vocab_blob((spec.get("model") or {}).get("vocab")))
    return h.hexdigest()
