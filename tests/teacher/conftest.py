"""Fixtures for teacher tests: tiny real transformers checkpoints saved once per session."""

from __future__ import annotations

import pytest

from teacher_fakes import save_tiny_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{"llama": folder, "qwen2": folder, "gpt2": folder} of tiny random causal LMs."""
    root = tmp_path_factory.mktemp("teachers")
    return {k: save_tiny_model(k, root / k) for k in ("llama", "qwen2", "gpt2")}
