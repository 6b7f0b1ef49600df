"""Helpers for projection tests: table-only tokenizers over synthetic TokenByteTables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdistill.tokenization.table import ROLE_BOS, ROLE_CHAT, ROLE_EOS, TokenByteTable


@dataclass(eq=False)
class TableTok:
    """What the exact/role methods and the artifact need of a tokenizer: a table and identity.

    Not a stand-in for encoding: methods that re-tokenize are tested with real tokenizers.
    """

    table: TokenByteTable
    name: str
    fingerprint: str
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    family: str = "synthetic"

    @property
    def vocab_size(self) -> int:
        return self.table.vocab_size


def random_table(rng: np.random.Generator, n: int, alphabet: bytes = b" ab\x00\xe4\xb8", max_len: int = 4,
                 roles=None) -> TokenByteTable:
    pieces = [bytes(rng.choice(list(alphabet), size=rng.integers(0, max_len + 1)).tolist()) for _ in range(n)]
    return TokenByteTable.from_bytes_list(pieces, roles=roles)


def synthetic_pair():
    """8 student / 8 teacher tokens: exact matches, duplicate teacher bytes, bos/eos/chat roles."""
    s = TokenByteTable.from_bytes_list([b"", b"", b" hello", b"a", b"\xe4", b" ", b"zz", b""],
                                       roles=[ROLE_BOS, ROLE_EOS, 0, 0, 0, 0, 0, ROLE_CHAT])
    t = TokenByteTable.from_bytes_list([b" ", b"a", b" hello", b"\xe4", b" ", b"", b"", b""],
                                       roles=[0, 0, 0, 0, 0, ROLE_BOS, ROLE_EOS, ROLE_EOS])
    return (TableTok(s, "syn-s", "f" * 64, bos_id=0, eos_id=1),
            TableTok(t, "syn-t", "e" * 64, bos_id=5, eos_id=None))
