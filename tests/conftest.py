"""Shared fixtures. Tests never reach a model hub; real tokenizers come from the asset cache that
``tools/fetch_assets.py`` fills (``make test`` runs it first)."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# before torch loads: idle OpenMP threads sleep instead of spinning (see xdistill/__init__.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# dtype "auto" (teachers, the student's compute dtype) means float32 in tests on every CPU, so
# runs compared at float32 tolerances stay comparable on CPUs with AMX (and in the processes the
# tests start); tests/test_precision.py unsets it to test the detection itself
os.environ.setdefault("XDISTILL_AUTO_DTYPE", "float32")

import pytest  # noqa: E402


@functools.lru_cache(maxsize=None)
def _load(name: str):
    from xdistill.tokenization import load_tokenizer

    return load_tokenizer(name)


@pytest.fixture(scope="session")
def get_tokenizer():
    """``get_tokenizer("gpt2")`` -> cached :class:`xdistill.tokenization.Tokenizer` from the assets."""
    return _load


def cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover
        return 0


@pytest.hookimpl(tryfirst=True)     # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    # `make test` runs two xdist workers (--dist loadgroup): the tests that load the real
    # pretrained models (GBs each) all go to one worker, so two of them never share the memory
    n = cuda_count()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    skip_multi = pytest.mark.skip(reason=f"needs two or more CUDA GPUs ({n} here)")
    xdist = config.pluginmanager.hasplugin("xdist")
    group = pytest.mark.xdist_group("real_models") if xdist else None
    for item in items:
        if group is not None and "real" in item.keywords:
            item.add_marker(group)
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(skip_multi if n else skip_gpu)
        elif "gpu" in item.keywords and n < 1:
            item.add_marker(skip_gpu)
