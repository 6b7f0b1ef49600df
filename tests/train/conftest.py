"""Fixtures for the off-policy trainer tests: tiny tokenizer-paired teachers, corpora, configs.

``tiny_assets``: two byte-level BPEs trained on Shakespeare (320 and 400 ids: a cross-tokenizer
pair), a same-tokenizer teacher and a cross-tokenizer teacher (tiny Llamas), a pkl projection
between the two tokenizers and a prepared train/eval corpus. ``write_config(tmp, assets, **kw)``
writes a run config (YAML) for them; ``run_cli(args, nproc)`` runs ``xdistill`` in a subprocess
(under torchrun when ``nproc > 1``) on its own port.
"""

from __future__ import annotations

import pytest

# re-exported for the test modules that load this file by path (new ones: import train_helpers)
from train_helpers import (REPO, TINY_STUDENT, _env, base_config, build_tiny_assets,  # noqa: F401
                           exported_weights, run_cli, train_records, write_config)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    return build_tiny_assets(tmp_path_factory.mktemp("tiny_assets"))


@pytest.fixture(scope="module")
def credit_lms(tiny_assets, tmp_path_factory):
    """Two tiny on-policy teachers (``same``: the student's tokenizer, ``cross``: the other one)
    and a prompt file, for the byte-credit and discount step tests."""
    import onpolicy_helpers as H

    root = tmp_path_factory.mktemp("credit_lms")
    return {"same": H.save_lm(root / "same", tiny_assets["tok_s"], seed=1),
            "cross": H.save_lm(root / "cross", tiny_assets["tok_t"], seed=2),
            "prompts": H.write_prompts(root / "prompts.jsonl")}
