"""The tokenizer pair: they differ the way real ones do (Llama/Qwen-style vs GPT-style numbers).

* **teacher** (``▁`` / Metaspace style, 700 BPE ids + 256 byte-fallback ids): digits are always split one by one
  (``pre_tokenizers.Digits(individual_digits=True)``), like Llama and Qwen;
* **student** (``Ġ`` / byte-level style, 3k ids): every 1-3 digit number, with or without a
  leading space, is a single token (:func:`check_whole_numbers` verifies all 2000 of them).

So almost no answer token has an identical-bytes counterpart on the teacher side (only one-digit
numbers do): the "numerals are all uncommon" situation of the X-Token paper. Both are trained with
the ``tokenizers`` library and saved as Hugging Face folders that
``xdistill.tokenization.load_tokenizer(path)`` loads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EOS = "<|eos|>"


def _alphabet(texts: list[str]) -> list[str]:
    chars = set("".join(texts)) | {chr(c) for c in range(32, 127)} | {"\n"}
    return sorted(chars)


def _number_texts(seed: int, repeats: int) -> list[str]:
    """Every number 0..999 many times, separated by spaces (``Ġ123``) and by ``:`` (``123``)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(repeats):
        nums = [str(int(n)) for n in rng.permutation(1000)]
        out.append((" " if r % 2 else ":").join(nums))
    return out


def _save(tok, out: Path, **special) -> Path:
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(str(out))
    return out


def train_teacher_tokenizer(out: Path, texts: list[str], vocab_size: int = 700) -> Path:
    """Metaspace (``▁``) BPE whose pre-tokenizer isolates every digit."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
        pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = sorted({c.replace(" ", "▁") for c in _alphabet(texts)})
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return _save(_with_byte_fallback(tok), out, eos_token=EOS)


def _with_byte_fallback(tok):
    """Append the 256 ``<0xNN>`` byte tokens and switch byte fallback on (like Llama's SPM), so
    no character is ever lost to ``<unk>`` and the token-bytes table is exact."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def train_student_tokenizer(out: Path, texts: list[str], vocab_size: int = 3000,
                            seed: int = 0) -> Path:
    """Byte-level (``Ġ``) BPE trained so that every 1-3 digit number is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(texts) + _number_texts(seed, 60), trainer)
    return _save(tok, out, eos_token=EOS)


def check_whole_numbers(tok) -> list[str]:
    """Numbers (0..999, with and without a leading space) that are NOT a single token."""
    bad = []
    for n in range(1000):
        for text in (f":{n}", f": {n}"):
            enc = tok.encode(text, add_special_tokens=False)
            if len(enc.ids) != 2:
                bad.append(text[1:])
    return bad


def check_split_digits(tok) -> list[str]:
    """Numbers whose teacher tokens are not one per digit (plus at most a space token)."""
    bad = []
    for n in range(0, 1000, 7):
        enc = tok.encode(f"A:{n}.", add_special_tokens=False)
        pieces = [tok.decode([int(i)]) for i in enc.ids]
        digits = [p for p in pieces if p.strip().isdigit()]
        if len(digits) != len(str(n)):
            bad.append(str(n))
    return bad


def twin_tokenizer(src: Path, out: Path) -> Path:
    """A copy of the tokenizer folder ``src`` that tokenizes exactly as it does but is *another
    tokenizer* to the trainer: its ``ByteLevel`` decoder's ``use_regex`` flag (read by the
    pre-tokenizer, never by decoding) is flipped, which changes the fingerprint and nothing
    else. A teacher over the student's tokenizer presented with its twin goes through the
    cross-tokenizer pipeline (alignment, units, byte credit) with its own model: one model
    scored both ways (issue-24 ninth protocol). Written once, safely when runs in parallel
    ask for it at the same time; raises if ``src`` has no ``ByteLevel`` decoder."""
    import json
    import shutil
    import tempfile

    if (out / "tokenizer.json").exists():
        return out
    spec = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    decoder = spec.get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        raise ValueError(f"{src}: a twin needs a ByteLevel decoder, found {decoder.get('type')!r}")
    decoder["use_regex"] = not decoder.get("use_regex", True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))  # one per writer
    for f in src.iterdir():
        if f.is_file() and f.name != "tokenizer.json":
            (tmp / f.name).write_bytes(f.read_bytes())
    (tmp / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    try:
        tmp.rename(out)
    except OSError:               # another run's writer got there first: theirs is the same
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "tokenizer.json").exists():
            raise
    return out
