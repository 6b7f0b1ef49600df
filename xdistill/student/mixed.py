"""Mixed precision on one process: bf16 compute weights cast from the float32 master weights.

What FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)`` does on many
processes, without a process group: the model's parameters stay float32 (the master weights: the
optimizer, its state, checkpoints and exports see only them), and every module computes with a
``compute_dtype`` copy of its own parameters made when the module runs:

* a forward pre-hook on each module that owns parameters casts them (``p.to(compute_dtype)``,
  a differentiable op) and puts the copies in the module's instance ``__dict__``, where Python's
  attribute lookup finds them before ``nn.Module.__getattr__`` reaches ``_parameters``; a forward
  hook (``always_call``: also after an exception) removes them again;
* in backward the cast's gradient arrives in float32 and is *accumulated* in float32 into the
  master parameter's ``.grad`` (micro-batches add in float32, like FSDP2's sharded gradients);
* activation checkpointing recomputes a layer through the same hooks (a fresh cast);
* without autograd (evaluation, generation) the copies are cached until a parameter changes
  (its version counter or storage) or any optimizer steps (torch's fused AdamW updates the
  parameters without bumping their version counters), so a generate loop casts the weights once,
  not per token.

An embedding table is not cast: its module looks up float32 rows and casts only them (the same
values as rows of a cast table), so a step never copies the whole table for the few rows it reads
(SmolLM2's is 49k x 576, tied to the output head, which casts it once); its gradient reaches the
master in float32 without a compute-dtype copy of the table's size. Only a plain ``nn.Embedding``
forward qualifies: one that computes on its rows (Gemma-3 scales them in the weights' dtype) casts
its table as every other module does.

Losses and log-softmax stay float32 in :mod:`xdistill.losses` (they upcast their inputs).
Buffers are not cast (rotary frequencies stay float32), as in FSDP2.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

_ATTR = "_xdistill_mixed_precision"


class ShadowCast:
    """The hooks of one model (see module doc); :meth:`remove` undoes them."""

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype):
        self.compute_dtype = compute_dtype
        self._model = model
        self._cache: dict[int, tuple[tuple, torch.Tensor]] = {}
        self._handles = []
        self._install()
        # any optimizer step may have changed the weights, version counter or not (a global hook:
        # it holds this object weakly and goes away with it)
        me = weakref.ref(self)

        def clear_after_step(*_):
            shadow = me()
            if shadow is not None:
                shadow._cache.clear()

        self._step_hook = register_optimizer_step_post_hook(clear_after_step)
        weakref.finalize(self, self._step_hook.remove)

    def _install(self) -> None:
        for module in self._model.modules():
            if type(module).forward is nn.Embedding.forward:  # float32 rows, then cast
                self._handles.append(module.register_forward_hook(self._cast_output))
                continue
            names = [n for n, p in module.named_parameters(recurse=False)
                     if p is not None and p.is_floating_point()]
            if names:
                self._handles.append(module.register_forward_pre_hook(self._pre(names)))
                self._handles.append(module.register_forward_hook(self._post(names),
                                                                  always_call=True))

    def _cast(self, p: nn.Parameter) -> torch.Tensor:
        if torch.is_grad_enabled():
            self._cache.clear()  # weights are about to change: no stale copies kept
            return p.to(self.compute_dtype)
        key = (p._version, p.data_ptr(), p.device)
        hit = self._cache.get(id(p))
        if hit is not None and hit[0] == key:
            return hit[1]
        cast = p.detach().to(self.compute_dtype)
        self._cache[id(p)] = (key, cast)
        return cast

    def _pre(self, names: list[str]):
        def hook(module: nn.Module, args):
            for n in names:
                module.__dict__[n] = self._cast(module._parameters[n])
        return hook

    def _cast_output(self, module: nn.Module, args, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.to(self.compute_dtype)
        return output

    @staticmethod
    def _post(names: list[str]):
        def hook(module: nn.Module, args, output):
            for n in names:
                module.__dict__.pop(n, None)
        return hook

    def _uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._cache.clear()

    def remove(self) -> None:
        """Undo the mixed precision for good: the model computes in float32 again and no longer
        reports bf16 compute (it can be given mixed precision again)."""
        self._uninstall()
        self._step_hook.remove()
        if self._model.__dict__.get(_ATTR) is self:
            self._model.__dict__.pop(_ATTR)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Inside the block the model computes with its float32 master weights (no hooks, no
        copies); on exit the hooks come back."""
        if not self._handles:
            raise RuntimeError("these mixed-precision hooks were removed; nothing to suspend")
        self._uninstall()
        try:
            yield
        finally:
            self._install()


def apply_shadow_mixed_precision(model: nn.Module, compute_dtype: torch.dtype) -> ShadowCast:
    """Make ``model`` (float32 master weights, not sharded) compute in ``compute_dtype``."""
    if getattr(model, _ATTR, None) is not None:
        raise ValueError(f"{type(model).__name__} already computes in "
                         f"{getattr(model, _ATTR).compute_dtype}")
    shadow = ShadowCast(model, compute_dtype)
    object.__setattr__(model, _ATTR, shadow)
    return shadow


def compute_dtype_of(model: nn.Module) -> torch.dtype:
    """The dtype ``model`` computes in: a one-process shadow's, FSDP2's ``param_dtype``, or its
    parameters' own."""
    shadow = getattr(model, _ATTR, None)
    if shadow is not None:
        return shadow.compute_dtype
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        if state is not None:  # FSDP2's private state: read defensively
            dtype = getattr(getattr(state(), "_mp_policy", None), "param_dtype", None)
            if dtype is not None:
                return dtype
            break
    return next(model.parameters()).dtype


@contextlib.contextmanager
def master_weights(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` computing with its float32 master weights inside the block: scores what a
    checkpoint or an export of a mixed-precision run holds (a bf16 forward cannot show updates
    below bf16's resolution until they add up). A model that computes in its parameters' own
    dtype is unchanged; FSDP2's compute copies are not this module's to suspend (an error)."""
    shadow = getattr(model, _ATTR, None)
    if shadow is not None:
        with shadow.suspended():
            yield model
        return
    if compute_dtype_of(model) != next(model.parameters()).dtype:
        raise ValueError(f"{type(model).__name__} computes in {compute_dtype_of(model)} through "
                         "FSDP2's MixedPrecisionPolicy: score its float32 weights from a "
                         "checkpoint or an export instead")
    yield model
