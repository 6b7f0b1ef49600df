"""Tiny settings of the quality harness shared by its tests (a 10x10 addition table, 1-layer models,
a few steps): they check the harness path, not quality."""

from __future__ import annotations

from toyq import task
from toyq.arms import ArmSettings
from toyq.prepare import PrepConfig

TINY_TASK = task.TaskConfig(max_operand=9, n_heldout=20, passes=2, text_fraction=0.2)
TINY_PREP = PrepConfig(task=TINY_TASK, big_layers=1, big_hidden=32, big_steps=4, weak_layers=1,
                       weak_hidden=32, weak_steps=3, batch=8, seq_len=32)
# a checkpoint (accuracy curve) and a held-out bpb evaluation every 2 steps: curve steps 2, 4
TINY_ARMS = ArmSettings(steps=4, batch=8, seq_len=32, layers=1, hidden=32, eval_every=2,
                        eval_batches=1)
