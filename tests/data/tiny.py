"""A tiny byte-level BPE trained on the spot, wrapped with the tokenizer contract the data stage
uses (ids, byte offsets, token-bytes table, eos/bos/pad ids). Used where the real tokenizers are not
needed (sources, packing, resume) so those tests are fast and independent of the asset cache."""

from __future__ import annotations

import hashlib

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from xdistill.tokenization.encode import Encoding
from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS, ROLE_TEXT, TokenByteTable

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Distillation moves knowledge from teachers to students; tokenizers differ.",
    "naïve café — 東京 emoji 🙂🙃 tabs\tand\nnewlines  double  spaces",
    "def f(x):\n    return x * 2  # code\n",
]


def _byte_decoder() -> dict[str, int]:
    from xdistill.tokenization.bytes import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


# the package's own encoding record (a plain container): what every consumer reads from it,
# ``phantom_bytes_T()`` included, behaves as with a real tokenizer
TinyEncoding = Encoding


class TinyTokenizer:
    """Minimal stand-in for ``xdistill.tokenization.Tokenizer`` (byte-level BPE, no chat template)."""

    family = "byte_bpe"
    lossy = False
    hf = None

    def __init__(self, vocab_size: int = 400, name: str = "tiny"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>", "<bos>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(CORPUS * 4, trainer)
        self._tok, self.name = tok, name
        self.eos_id, self.bos_id = tok.token_to_id("<eos>"), tok.token_to_id("<bos>")
        self.pad_id = self.eos_id
        dec = _byte_decoder()
        vocab = tok.get_vocab()
        pieces, roles = [b""] * len(vocab), [ROLE_TEXT] * len(vocab)
        for piece, i in vocab.items():
            if i == self.eos_id:
                roles[i] = ROLE_EOS
            elif i == self.bos_id:
                roles[i] = ROLE_BOS
            else:
                pieces[i] = bytes(dec[c] for c in piece)
        self.table = TokenByteTable.from_bytes_list(pieces, roles)
        self.vocab_size = len(vocab)
        self.fingerprint = hashlib.sha256(b"".join(pieces) + bytes(vocab_size)).hexdigest()[:16]

    def encode(self, text: str, add_special_tokens: bool = False,
               specials_as_text: bool = False) -> TinyEncoding:
        return self.encode_batch([text], specials_as_text=specials_as_text)[0]

    def encode_batch(self, texts, add_special_tokens: bool = False, specials_as_text: bool = False):
        out = []
        self._tok.encode_special_tokens = specials_as_text   # "<eos>" written out: its bytes
        try:
            encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        finally:
            self._tok.encode_special_tokens = False
        for text, enc in zip(texts, encs):
            ids = np.asarray(enc.ids, dtype=np.int64)
            lens = self.table.lengths_V[ids]
            ends = np.cumsum(lens)
            out.append(TinyEncoding(ids, ends - lens, ends))
        return out

    def decode(self, ids) -> str:
        return self.table.concat(ids).decode("utf-8", errors="replace")
