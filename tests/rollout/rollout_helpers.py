"""Tiny models and a permuted-vocabulary teacher for the rollout tests.

Legend: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from xdistill.tokenization.encode import Encoding
from xdistill.tokenization.table import TokenByteTable


def tiny_llama(vocab_size: int, seed: int = 0, logit_scale: float = 1.0, *, hidden_size: int = 32,
               heads: int = 4, kv_heads: int = 2):
    """A 2-layer Llama (hidden size 32, head size 8 by default); ``logit_scale`` sharpens its
    (random) distributions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                      intermediate_size=2 * hidden_size, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def recomputed_logprobs(tok, model, ro, temperature, top_p=1.0):
    """Forward on the right-padded prompt+response rows; sampled-token log-probs [B, Tr]."""
    from xdistill.losses.onpolicy import input_token_logprobs
    from xdistill.rollout import RolloutScorer, nucleus_logprobs

    batch = RolloutScorer(tok)(ro).batch
    with torch.no_grad():
        z = model(input_ids=batch.input_ids_BTs, attention_mask=batch.attention_mask_BTs.long()).logits
    if top_p == 1.0:
        lp_BTs = input_token_logprobs(z, batch.input_ids_BTs, temperature=temperature)
    else:
        lp = nucleus_logprobs(z.reshape(-1, z.shape[-1]), temperature, top_p).view_as(z)
        nxt = batch.input_ids_BTs[:, 1:, None]
        lp_BTs = torch.cat([torch.zeros_like(z[:, :1, 0]), lp[:, :-1].gather(2, nxt).squeeze(2)], 1)
    out = torch.zeros_like(ro.behaviour_logp_BTr)
    for b in range(ro.batch_size):
        p, r = int(ro.prompt_len_B[b]), int(ro.response_len_B[b])
        out[b, :r] = lp_BTs[b, p:p + r]
    return out


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

    def encode(self, text, add_special_tokens=False, specials_as_text=False):
        e = self.base.encode(text, add_special_tokens=add_special_tokens,
                             specials_as_text=specials_as_text)
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
