"""AdamW with decoupled weight decay, the learning-rate schedule, and gradient clipping.

Weight decay (:func:`param_groups`): a parameter is decayed iff it has >= 2 dimensions and its
name does not look like a norm or a bias. 1-D tensors are biases and norm scales (LayerNorm,
RMSNorm): decaying them pulls the scales toward 0, which is harmful, so they go to a second group
with ``weight_decay = 0``. Embedding matrices are 2-D and decayed unless
``OptimConfig.decay_embeddings`` is false. Works on plain and on FSDP2 (DTensor) parameters: a
DTensor reports its global shape, so every rank forms the same groups.

Schedule (:func:`lr_factor`): the multiplier of the peak ``lr`` used by optimizer step ``s``
(0-based: ``s`` steps have been taken before it), with ``W = warmup_steps``, ``N = total_steps``,
``m = min_lr_ratio``::

    s <  W           : (s + 1) / W                    (linear warmup; step W-1 runs at the peak)
    W <= s < N       : p = (s - W) / (N - W)          (progress through the decay, in [0, 1))
        cosine       : m + (1 - m) * (1 + cos(pi * p)) / 2
        linear       : 1 - (1 - m) * p
        constant     : 1
    s >= N           : m for cosine/linear, 1 for constant

The scheduler is a ``LambdaLR`` over a picklable :class:`LrSchedule`, so its state dict
round-trips through checkpoints. Call ``scheduler.step()`` once after every ``optimizer.step()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from xdistill.errors import ConfigError

_NO_DECAY_MARKERS = ("norm", "bias", "ln_", "layernorm")


@dataclass
class OptimConfig:
    """AdamW hyper-parameters."""

    # peak learning rate (reached at the end of warmup)
    lr: float = 3.0e-4
    # AdamW beta1 (momentum of the gradient average)
    beta1: float = 0.9
    # AdamW beta2 (momentum of the squared-gradient average)
    beta2: float = 0.95
    # AdamW epsilon added to the denominator
    eps: float = 1.0e-8
    # decoupled weight decay of matrices (norm scales and biases never decay)
    weight_decay: float = 0.1
    # decay embedding (and untied output) matrices too
    decay_embeddings: bool = True
    # clip the global gradient L2 norm to this value before each step; 0 = no clipping
    grad_clip: float = 1.0
    # AdamW kernel: "auto" (fused where torch has the kernel and the parameters are plain
    # tensors: CPU and CUDA, one process; "foreach" for FSDP2's sharded parameters), "foreach"
    # (multi-tensor), "fused" (one kernel per parameter group: ~3x faster than foreach on CPU,
    # benchmarks/RESULTS.md) or "for_loop"
    implementation: Literal["auto", "foreach", "fused", "for_loop"] = "auto"

    def validate(self) -> OptimConfig:
        """Check value ranges; returns self. Raises ConfigError naming the key."""
        if not self.lr > 0:
            raise ConfigError(f"optim.lr: must be > 0, got {self.lr}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"optim.{key}: must be in [0, 1), got {getattr(self, key)}")
        if not self.eps > 0:   # written so that NaN fails too
            raise ConfigError(f"optim.eps: must be > 0, got {self.eps}")
        for key in ("weight_decay", "grad_clip"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"optim.{key}: must be >= 0, got {getattr(self, key)}")
        return self


@dataclass
class SchedulerConfig:
    """Learning-rate schedule: linear warmup, then a decay to ``min_lr_ratio * lr``."""

    # shape after warmup: "cosine" or "linear" decay to min_lr_ratio, or "constant"
    kind: Literal["cosine", "linear", "constant"] = "cosine"
    # optimizer steps of linear warmup from lr/warmup_steps up to lr (0 = start at lr)
    warmup_steps: int = 0
    # optimizer steps of the whole run (warmup included); the decay ends here
    total_steps: int = 1000
    # final learning rate as a fraction of lr (cosine/linear)
    min_lr_ratio: float = 0.1

    def validate(self) -> SchedulerConfig:
        """Check value ranges; returns self. Raises ConfigError naming the key."""
        if self.warmup_steps < 0:
            raise ConfigError(f"scheduler.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.total_steps < max(1, self.warmup_steps):
            raise ConfigError(f"scheduler.total_steps ({self.total_steps}) must be >= 1 and >= "
                              f"scheduler.warmup_steps ({self.warmup_steps})")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"scheduler.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        return self


def lr_factor(step: int, cfg: SchedulerConfig) -> float:
    """Multiplier of the peak lr for 0-based optimizer step ``step`` (formula in the module doc)."""
    w, n, m = cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio
    if step < w:
        return (step + 1) / w
    if cfg.kind == "constant":
        return 1.0
    if step >= n:
        return m
    progress = (step - w) / (n - w)
    if cfg.kind == "cosine":
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - (1.0 - m) * progress


class LrSchedule:
    """Picklable ``step -> factor`` callable for ``LambdaLR`` (its state survives checkpoints)."""

    def __init__(self, cfg: SchedulerConfig):
        self.kind = cfg.kind
        self.warmup_steps = cfg.warmup_steps
        self.total_steps = cfg.total_steps
        self.min_lr_ratio = cfg.min_lr_ratio

    def __call__(self, step: int) -> float:
        return lr_factor(step, SchedulerConfig(self.kind, self.warmup_steps, self.total_steps,
                                               self.min_lr_ratio))


def _is_no_decay(name: str, param: torch.Tensor, decay_embeddings: bool, embed_ids: set[int]) -> bool:
    if param.ndim < 2:
        return True
    lowered = name.lower()
    if any(marker in lowered for marker in _NO_DECAY_MARKERS):
        return True
    return not decay_embeddings and id(param) in embed_ids


def _embedding_param_ids(model: nn.Module) -> set[int]:
    ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    if out is not None and getattr(out, "weight", None) is not None:
        ids.add(id(out.weight))
    return ids


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = True) -> list[dict]:
    """Two AdamW groups, ``decay`` and ``no_decay`` (rules in the module doc); frozen parameters
    (``requires_grad=False``) are left out; each group records its parameter ``names``."""
    embed_ids = set() if decay_embeddings else _embedding_param_ids(model)
    groups = {"decay": ([], []), "no_decay": ([], [])}
    for name, param in model.named_parameters():  # shared (tied) parameters appear once
        if not param.requires_grad:
            continue
        key = "no_decay" if _is_no_decay(name, param, decay_embeddings, embed_ids) else "decay"
        groups[key][0].append(param)
        groups[key][1].append(name)
    return [
        {"params": groups["decay"][0], "names": groups["decay"][1], "weight_decay": weight_decay},
        {"params": groups["no_decay"][0], "names": groups["no_decay"][1], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters with the decay/no-decay split."""
    cfg.validate()
    kept = [(role, g) for role, g in zip(("decay", "no_decay"), param_groups(
        model, cfg.weight_decay, cfg.decay_embeddings)) if g["params"]]
    groups = [{k: v for k, v in g.items() if k != "names"}  # names stay out of optimizer state
              for _, g in kept]
    if not groups:
        raise ConfigError(f"optim: {type(model).__name__} has no trainable parameters")
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for_loop": {"foreach": False}}
    name = cfg.implementation if cfg.implementation != "auto" else auto_implementation(groups)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                  **impl[name])
    # each group's role, by position (an attribute: load_state_dict replaces the group dicts,
    # and a decay group at weight_decay 0 looks like the no-decay one)
    optimizer.xdistill_group_roles = tuple(role for role, _ in kept)
    return optimizer


def auto_implementation(groups: list[dict]) -> str:
    """``fused`` when every parameter is a plain floating tensor on CPU or CUDA (torch's fused
    AdamW kernels), else ``foreach`` (FSDP2's DTensor parameters, other devices)."""
    params = [p for g in groups for p in g["params"]]
    plain = all(type(p.data) is torch.Tensor and p.is_floating_point()
                and p.device.type in ("cpu", "cuda") for p in params)
    return "fused" if plain and len({p.device for p in params}) == 1 else "foreach"


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` applying :func:`lr_factor` to every group's peak lr. Creating it sets the lr
    of step 0 immediately (so the first ``optimizer.step()`` already uses the schedule)."""
    cfg.validate()
    return torch.optim.lr_scheduler.LambdaLR(optimizer, LrSchedule(cfg))


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global L2 norm of all gradients to ``max_norm`` (0 = only measure it); returns the
    norm before clipping. With FSDP2 the gradients are DTensor shards and the norm is reduced over
    all ranks, so every rank gets the same value (collective: every rank must call it)."""
    # deferred: torch.distributed.tensor (~0.5 s import; only FSDP-sharded params)
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    grads = [p.grad for p in params]
    if any(g.dtype == torch.float16 for g in grads):
        # float16 gradients' norm is taken in float32 (a global norm above 65504 would be inf),
        # tensor by tensor: no float32 copy of the gradients
        norms = [torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) for g in grads]
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    else:
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if max_norm > 0:  # scales every grad by min(1, max_norm / (total + 1e-6))
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    if isinstance(total, DTensor):  # a partial/sharded norm: reduce it over the ranks
        total = total.full_tensor()
    return float(total)


def reapply_config(optimizer: torch.optim.Optimizer, scheduler, optim_cfg: OptimConfig,
                   sched_cfg: SchedulerConfig) -> list[str]:
    """After loading a checkpoint: the run's config wins over the hyper-parameters stored in it.

    ``optimizer.load_state_dict`` / ``scheduler.load_state_dict`` restore the peak lr, betas, eps
    and the schedule of the run that wrote the checkpoint, so an ``optim.lr=...`` override on
    resume would be silently ignored. This sets them from the config again (keeping the step
    count and the moments) and returns one ``"key: old -> new"`` line per change. The decay group
    gets ``optim.weight_decay`` and the no-decay group 0 (told apart by the roles
    :func:`build_optimizer` recorded, not by their values), and every group gets back the AdamW
    kernel ``optim.implementation`` chose for this run (the checkpoint's ``fused``/``foreach``).
    """
    changes = []
    new_sched = LrSchedule(sched_cfg)
    for i, lam in enumerate(scheduler.lr_lambdas):
        if isinstance(lam, LrSchedule) and vars(lam) != vars(new_sched):
            old = {k: v for k, v in vars(lam).items() if vars(new_sched)[k] != v}
            new = {k: vars(new_sched)[k] for k in old}
            changes.append(f"scheduler: {old} -> {new}")
            scheduler.lr_lambdas[i] = LrSchedule(sched_cfg)
    if any(b != optim_cfg.lr for b in scheduler.base_lrs):
        changes.append(f"optim.lr: {scheduler.base_lrs[0]:g} -> {optim_cfg.lr:g}")
        scheduler.base_lrs = [optim_cfg.lr] * len(scheduler.base_lrs)
    for group in optimizer.param_groups:
        if tuple(group["betas"]) != (optim_cfg.beta1, optim_cfg.beta2):
            changes.append(f"optim.beta1/beta2: {tuple(group['betas'])} -> "
                           f"{(optim_cfg.beta1, optim_cfg.beta2)}")
            group["betas"] = (optim_cfg.beta1, optim_cfg.beta2)
        if group["eps"] != optim_cfg.eps:
            changes.append(f"optim.eps: {group['eps']:g} -> {optim_cfg.eps:g}")
            group["eps"] = optim_cfg.eps
    changes += _reapply_weight_decay(optimizer, optim_cfg.weight_decay)
    changes += _reapply_kernel(optimizer)
    if not changes:
        return []
    step = scheduler.last_epoch
    for group, base, lam in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * lam(step)
        group["initial_lr"] = base
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return list(dict.fromkeys(changes))


def _kernel_name(group: dict) -> str:
    if group.get("fused"):
        return "fused"
    return {True: "foreach", False: "for_loop"}.get(group.get("foreach"), "default")


def _reapply_weight_decay(optimizer: torch.optim.Optimizer, weight_decay: float) -> list[str]:
    """Decay group at ``weight_decay``, no-decay group at 0 (roles: :func:`build_optimizer`; an
    optimizer built elsewhere has none: a group at 0 is then taken for a no-decay group)."""
    roles = getattr(optimizer, "xdistill_group_roles", None) or tuple(
        "no_decay" if g["weight_decay"] == 0.0 else "decay" for g in optimizer.param_groups)
    changes = []
    for group, role in zip(optimizer.param_groups, roles):
        want = weight_decay if role == "decay" else 0.0
        if group["weight_decay"] != want:
            key = "optim.weight_decay" if role == "decay" else "optim.weight_decay (no-decay group)"
            changes.append(f"{key}: {group['weight_decay']:g} -> {want:g}")
            group["weight_decay"] = want
    return changes


def _reapply_kernel(optimizer: torch.optim.Optimizer) -> list[str]:
    """Every group's ``fused``/``foreach`` back to the constructor's (``optimizer.defaults``: the
    kernel ``optim.implementation`` chose for this run; ``load_state_dict`` restored the
    checkpoint's). A fused kernel keeps its step counts as float32 on the parameter's device, the
    others on the CPU: they move with the flags."""
    changes = []
    for group in optimizer.param_groups:
        old = _kernel_name(group)
        for key in ("fused", "foreach"):
            group[key] = optimizer.defaults.get(key)
        if old == _kernel_name(group):
            continue
        changes.append(f"optim.implementation: {old} -> {_kernel_name(group)}")
        on_device = bool(group["fused"] or group.get("capturable"))
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[p]["step"] = (step.to(p.device, torch.float32) if on_device
                                              else step.to("cpu"))
    return changes
