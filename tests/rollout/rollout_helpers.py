"""Tiny models and a permuted-vocabulary teacher for the rollout tests.

Legend: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from xdistill.tokenization.encode import Encoding
from xdistill.tokenization.table import TokenByteTable


def tiny_llama(vocab_size: int, seed: int = 0, logit_scale: float = 1.0):
    """A 2-layer Llama with hidden size 32; ``logit_scale`` sharpens its (random) distributions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


class PermutedTokenizer:
    """The student's tokenizer with every id renamed through a permutation ``perm`` (new id of
    student id v is ``perm[v]``): a different tokenizer (other ids, other fingerprint) that
    segments every text exactly like the student and gives every token the same bytes."""

    def __init__(self, base, seed: int = 0):
        self.base = base
        V = base.vocab_size
        self.perm = np.random.default_rng(seed).permutation(V).astype(np.int64)
        self.inv = np.argsort(self.perm)
        t = base.table
        pieces = [t.token_bytes(int(v)) for v in self.inv]
        self.table = TokenByteTable.from_bytes_list(pieces, roles=t.roles_V[self.inv], lossy=t.lossy)
        self.name, self.family, self.vocab_size = f"perm-{base.name}", base.family, V
        self.fingerprint = "perm-" + base.fingerprint
        self.hf, self.lossy = base.hf, base.lossy
        mp = lambda i: None if i is None else int(self.perm[i])  # noqa: E731
        self.bos_id, self.eos_id, self.pad_id = mp(base.bos_id), mp(base.eos_id), mp(base.pad_id)

    def encode(self, text, add_special_tokens=False):
        e = self.base.encode(text, add_special_tokens=add_special_tokens)
        return Encoding(self.perm[np.asarray(e.ids)], e.starts, e.ends, e.phantom_prefix)

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids):
        return self.base.decode(self.inv[np.asarray(ids)])


class PermutedModel(torch.nn.Module):
    """``model`` seen through the permutation: input ids mapped back, logit columns permuted, so
    ``logits_t[..., perm[v]] = logits_s[..., v]``: the same distribution over bytes."""

    def __init__(self, model, perm: np.ndarray):
        super().__init__()
        self.model = model
        self.register_buffer("perm", torch.from_numpy(perm))
        self.register_buffer("inv", torch.from_numpy(np.argsort(perm)))

    def forward(self, input_ids, attention_mask=None):
        z = self.model(input_ids=self.inv[input_ids], attention_mask=attention_mask).logits
        return z[..., self.inv]
