"""Review tests (session 24) for xdistill/precision.py and xdistill/student/mixed.py."""

from __future__ import annotations

import types

import torch

from xdistill import precision


def test_auto_on_a_pre_ampere_cuda_device_is_float32(monkeypatch):
    """A compute-capability 7.x GPU (V100, T4) has no native bf16; torch's
    ``is_bf16_supported()`` still says True there (``including_emulation=True`` by default)
    once a bf16 tensor can be created, so ``auto`` must not follow it."""
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(precision, "_LOGGED", set())
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *_: types.SimpleNamespace(major=7, minor=0))
    # what happens on a real V100: a bf16 tensor can be created (emulated bf16)
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda *_: True)
    fast, reason = precision.fast_bf16("cuda")
    assert fast is False, reason
    assert precision.resolve_compute_dtype("auto", "cuda", "review") == torch.float32


def test_removed_shadow_no_longer_reports_bf16_compute():
    """``ShadowCast.remove`` "undoes" the hooks: the model then computes in float32, so
    ``compute_dtype_of`` must say float32 and ``master_weights`` must not raise."""
    from torch import nn

    from xdistill.student.mixed import (apply_shadow_mixed_precision, compute_dtype_of,
                                        master_weights)

    model = nn.Linear(4, 4)
    shadow = apply_shadow_mixed_precision(model, torch.bfloat16)
    shadow.remove()
    x = torch.randn(2, 4)
    assert model(x).dtype == torch.float32            # really computes in float32 now
    assert compute_dtype_of(model) == torch.float32
    with master_weights(model) as m:                   # must not raise RuntimeError
        assert m(x).dtype == torch.float32
