"""Engines for transport/failure tests (the real TeacherWorker is tested elsewhere) and tiny model
builders. Importable by spawned subprocesses (pytest puts this folder on sys.path, which spawn
children inherit) and shipped by value to Ray workers (``cloudpickle.register_pickle_by_value``).

Legend: B batch, Tt teacher tokens, V vocabulary.
"""

from __future__ import annotations

import os
import random
import time

import torch

from xdistill.teacher.worker import TeacherInfo


def _info(name: str, V: int, device: str = "cpu") -> TeacherInfo:
    return TeacherInfo(name=name, kind="logits", vocab_size=V, student_vocab_size=0, top_k=0,
                       temperature=1.0, device=device, logits_dtype=torch.float32, pid=os.getpid())


class StampEngine:
    """Writes the step id into every element, in two halves with a random pause between them
    (and a random pause before), so a reader that shares the slot would see torn/stale data.
    ``raise_on`` (a step id) raises a ValueError there to test error propagation."""

    def __init__(self, name="stamp", V=64, max_delay_s=0.001, raise_on=-1, seed=0, device="cpu"):
        self.info = _info(name, V, device)
        self.max_delay_s, self.raise_on = max_delay_s, raise_on
        self.rng = random.Random(seed)

    def output_spec(self, B, Tt):
        return {"logits_BTtV": ((B, Tt, self.info.vocab_size), torch.float32)}

    def run_into(self, request, out):
        if request.step == self.raise_on:
            explode_in_worker(request.step)
        flat = out["logits_BTtV"].view(-1)
        half = flat.numel() // 2
        time.sleep(self.rng.random() * self.max_delay_s)
        flat[:half].fill_(float(request.step))
        time.sleep(self.rng.random() * self.max_delay_s)
        flat[half:].fill_(float(request.step))
        # the token ids round-trip too: row sums of ids in the first column
        out["logits_BTtV"][:, :, 0] = request.input_ids_BTt.float() + request.step


def explode_in_worker(step):
    raise ValueError(f"boom from worker at step {step}")


class SleepEngine(StampEngine):
    """Sleeps ``sleep_s`` inside every forward (a hung or slow teacher)."""

    def __init__(self, sleep_s=1000.0, **kw):
        super().__init__(**kw)
        self.sleep_s = sleep_s

    def run_into(self, request, out):
        time.sleep(self.sleep_s)
        super().run_into(request, out)


class BrokenLoadEngine:
    """Fails while loading (as a missing checkpoint would)."""

    def __init__(self):
        raise RuntimeError("cannot load the teacher weights from nowhere")


def save_tiny_model(kind: str, path) -> str:
    """Build a tiny randomly initialised causal LM of ``kind`` and save it to ``path``."""
    import transformers as tf

    torch.manual_seed({"llama": 0, "qwen2": 1, "gpt2": 2}[kind])
    if kind == "llama":
        cfg = tf.LlamaConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                             max_position_embeddings=128)
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = tf.Qwen2Config(vocab_size=900, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                             max_position_embeddings=128)
        model = tf.Qwen2ForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = tf.GPT2Config(vocab_size=800, n_embd=32, n_layer=2, n_head=4, n_positions=128)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(kind)
    model.save_pretrained(str(path))
    return str(path)


def random_batch(V: int, B=3, Tt=12, seed=0):
    """Right-padded ids/mask with rows of different lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, Tt), generator=g)
    lens = torch.tensor([Tt - 3 * (b % 3) for b in range(B)])
    mask = torch.arange(Tt)[None, :] < lens[:, None]
    ids = torch.where(mask, ids, torch.zeros_like(ids))
    return ids, mask


def random_projection(Vs: int, Vt: int, seed=0) -> torch.Tensor:
    """Sparse non-negative [Vs, Vt] with 1-3 student tokens per teacher token (columns sum to 1)."""
    g = torch.Generator().manual_seed(seed)
    rows, cols, vals = [], [], []
    for t in range(Vt):
        k = int(torch.randint(1, 4, (1,), generator=g))
        r = torch.randperm(Vs, generator=g)[:k]
        w = torch.rand(k, generator=g) + 0.1
        rows += r.tolist(); cols += [t] * k; vals += (w / w.sum()).tolist()
    return torch.sparse_coo_tensor(torch.tensor([rows, cols]), torch.tensor(vals), (Vs, Vt),
                                   check_invariants=True)


def shm_files(pid: int) -> list[str]:
    import glob

    return glob.glob(f"/dev/shm/xdistill_{pid}_*")


def reference_logits(folder: str, ids, mask):
    """Plain full-batch forward in this process (the reference every placement must match)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask.long()).logits.float()
