"""FSDP2 for the student: the ONE place in xdistill where ``fully_shard`` is applied.

:func:`parallelize_student` takes a plain transformers causal LM and

1. wraps each decoder layer in a non-reentrant activation-checkpoint wrapper (optional; done
   before sharding so FSDP2 sees the wrapped layers),
2. calls ``fully_shard`` on every decoder layer, then on the root module (which then owns the
   embeddings, final norm and output layer, tied or not), with a ``MixedPrecisionPolicy``
   (compute dtype ``param_dtype``, gradient reduction in ``reduce_dtype``) and optionally a
   ``CPUOffloadPolicy``; on one process without a process group, the same mixed precision by
   a per-module cast (:mod:`xdistill.student.mixed`),
3. sets the gradient reduction to a *sum* over data-parallel ranks when
   ``StudentConfig.grad_reduce == "sum"`` (see :mod:`xdistill.distributed` for the loss
   normalisation that makes this exact).

Decoder layers are found generically (:func:`find_decoder_layers`): the usual attribute paths of
transformers models first, otherwise the largest ``nn.ModuleList`` of identical blocks.
Works with gloo on CPU and NCCL on GPU: FSDP2 moves parameters to the mesh's device type itself.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                        CheckpointWrapper,
                                                                        checkpoint_wrapper)

from xdistill import distributed as xdist
from xdistill.errors import ConfigError, XDistillError
from xdistill.student.config import StudentConfig
from xdistill.student.mixed import apply_shadow_mixed_precision

# attribute paths of the decoder-layer list in common transformers architectures
KNOWN_LAYER_PATHS = (
    "model.layers",                 # llama, mistral, qwen2/3, gemma, phi3, olmo, ...
    "model.language_model.layers",  # multimodal wrappers
    "model.decoder.layers",         # opt
    "transformer.h",                # gpt2, gpt-j, bloom, falcon
    "transformer.layers",
    "transformer.blocks",           # mpt
    "gpt_neox.layers",              # gpt-neox, pythia
)


def _get_path(model: nn.Module, path: str):
    node = model
    for part in path.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _identical_blocks(mod: nn.ModuleList) -> bool:
    kinds = {type(m) for m in mod}
    return len(mod) > 0 and len(kinds) == 1 and any(True for _ in mod[0].parameters())


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ``nn.ModuleList`` of decoder blocks of ``model``.

    Tries :data:`KNOWN_LAYER_PATHS`, then any ``nn.ModuleList`` whose entries are all of one class
    and hold parameters, picking the one with the most parameters. Raises
    :class:`XDistillError` naming the model class when there is none.
    """
    for path in KNOWN_LAYER_PATHS:
        node = _get_path(model, path)
        if isinstance(node, nn.ModuleList) and _identical_blocks(node):
            return node
    best, best_n = None, 0
    for _, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and _identical_blocks(mod):
            n = sum(p.numel() for p in mod.parameters())
            if n > best_n:
                best, best_n = mod, n
    if best is None:
        raise XDistillError(
            f"parallelize_student: found no decoder layers in {type(model).__name__} (looked for "
            f"{', '.join(KNOWN_LAYER_PATHS)} and any nn.ModuleList of identical blocks)")
    return best


def apply_activation_checkpointing(layers: nn.ModuleList) -> None:
    """Replace each layer in ``layers`` by a non-reentrant checkpoint wrapper (in place).

    The wrapper forwards attribute access to the wrapped layer and strips its
    ``_checkpoint_wrapped_module.`` prefix from state-dict keys, so checkpoints and HF exports keep
    the original parameter names.
    """
    for i, layer in enumerate(layers):
        if not isinstance(layer, CheckpointWrapper):
            layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def _policies(cfg: StudentConfig, mesh):
    # deferred: torch.distributed.fsdp (~0.7 s import; only FSDP-sharded models)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    compute, reduce = cfg.compute_dtypes(mesh.device_type)
    param_dtype = None if compute == cfg.torch_dtype else compute
    reduce_dtype = None if param_dtype is None and reduce == cfg.torch_dtype else reduce
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if not cfg.cpu_offload:
        return mp, OffloadPolicy()
    if mesh.device_type != "cuda":
        raise ConfigError("student.cpu_offload: CPU offload needs CUDA devices; on a CPU mesh the "
                          "parameters are already in CPU memory (set cpu_offload: false)")
    return mp, CPUOffloadPolicy(pin_memory=True)


def parallelize_student(model: nn.Module, mesh=None, cfg: StudentConfig | None = None,
                        device: torch.device | str = "cpu") -> nn.Module:
    """Apply activation checkpointing and FSDP2 to ``model`` in place; returns it.

    ``mesh``: a 1-D ``("dp_shard",)`` or 2-D ``("dp_replicate", "dp_shard")`` device mesh; None
    builds one from the running process group (:func:`xdistill.distributed.build_device_mesh`).
    With no process group at all (one plain process) there is nothing to shard: activation
    checkpointing is applied, and when the compute dtype (``student.param_dtype`` on ``device``)
    differs from the master dtype, the one-process equivalent of FSDP2's mixed precision
    (:mod:`xdistill.student.mixed`): the parameters stay in the master dtype.
    """
    # deferred: torch.distributed.fsdp (~0.7 s import; only FSDP-sharded models)
    from torch.distributed.fsdp import FSDPModule, fully_shard

    cfg = (cfg or StudentConfig()).validate()
    if isinstance(model, FSDPModule):
        raise XDistillError(f"parallelize_student: {type(model).__name__} is already sharded")
    layers = find_decoder_layers(model)
    if mesh is None:       # before the model is touched: a config error leaves it as it was
        mesh = xdist.build_device_mesh(dp_replicate=cfg.dp_replicate)
    if mesh is None:
        if cfg.cpu_offload:
            raise ConfigError("student.cpu_offload: CPU offload is FSDP2's and needs a process "
                              "group (run under torchrun, --nproc-per-node 1 for one GPU); one "
                              "plain process keeps the whole model on its device")
        compute, _ = cfg.compute_dtypes(device)    # may raise: still before any change
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(layers)
        if compute != cfg.torch_dtype:
            apply_shadow_mixed_precision(model, compute)
        return model
    mp, offload = _policies(cfg, mesh)
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(layers)
    n = len(layers)
    for i, layer in enumerate(layers):
        # the last layer's parameters are needed first in backward: keep them gathered
        reshard = cfg.reshard_after_forward and i < n - 1
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard)
    # root: reshard_after_forward=None lets FSDP2 keep the root's parameters for backward
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=None)
    _set_grad_reduction(model, cfg.grad_reduce)
    return model


def _set_grad_reduction(model: nn.Module, mode: str) -> None:
    """Gradients are reduced with plain SUM collectives (supported by gloo and NCCL; gloo has no
    AVG/PREMUL_SUM), then divided by the data-parallel size for "mean" or not at all for "sum"."""
    # deferred: torch.distributed.fsdp (~0.7 s import; only FSDP-sharded models)
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
            if mode == "sum":
                module.set_gradient_divide_factor(1.0)
