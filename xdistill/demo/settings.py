"""What ``xdistill demo distill`` runs: the model pair, the held-out play, the arms and the budgets.

Kept free of torch and transformers: ``xdistill demo --help`` builds its text from these names
without importing the trainer (:mod:`xdistill.demo.real_pair` does the work).
"""

from __future__ import annotations

from dataclasses import dataclass

TEACHER, STUDENT = "gemma3-270m", "smollm2-135m"
HELD_OUT, HELD_OUT_TITLE = "tempest", "The Tempest"
# held-out windows: batches of EVAL_BATCH x EVAL_SEQ_LEN tokens of the model's own tokenizer
EVAL_BATCH, EVAL_SEQ_LEN = 4, 128
# the two arms, in words (the report and --help)
ARMS = {"ce": "CE only on the slice, no teacher",
        "pkl": "P-KL to the adapted Gemma through the projection, + CE (weight 1 each)"}


@dataclass(frozen=True)
class DemoSettings:
    """Budgets and the recipe of ``xdistill demo distill`` (one seed, shared by both arms)."""

    teacher_steps: int = 20       # CE steps adapting Gemma-3-270M to the domain
    steps: int = 30               # student steps per arm
    eval_batches: int = 6         # held-out batches of EVAL_BATCH x EVAL_SEQ_LEN tokens
    batch: int = 4                # rows per step (teacher adaptation and arms)
    seq_len: int = 64             # student tokens per row
    teacher_seq_len: int = 128    # Gemma tokens per row while adapting
    lr: float = 1e-4              # student peak learning rate (both arms)
    teacher_lr: float = 3e-5      # adaptation learning rate
    slice_kb: int = 40            # the student's slice of the domain text
    seed: int = 0                 # data order and initialisation, the same for both arms
    sample_tokens: int = 40       # greedy continuation length
