"""AdamW groups, LR schedule and clipping. The schedule test proves the configured lr reaches the
optimizer: every step's parameter update is recomputed in float64 from the AdamW definition with
the closed-form lr, and must match what the optimizer did."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from xdistill.errors import ConfigError
from xdistill.train.optim import (
    OptimConfig,
    SchedulerConfig,
    build_optimizer,
    build_scheduler,
    clip_grad_norm,
    param_groups,
    reapply_config,
)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.proj = nn.Linear(3, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 5, bias=False)
        self.frozen = nn.Parameter(torch.ones(2, 2), requires_grad=False)

    def forward(self, ids):
        return self.head(self.norm(self.proj(self.embed(ids))))

    def get_output_embeddings(self):
        return self.head


def expected_lr(s: int, peak: float, kind: str, warmup: int, total: int, floor: float) -> float:
    """The schedule written from its definition (independently of xdistill.train.optim)."""
    if s < warmup:
        return peak * (s + 1) / warmup
    if kind == "constant":
        return peak
    if s >= total:
        return peak * floor
    frac = (s - warmup) / (total - warmup)
    if kind == "linear":
        return peak * (1 - (1 - floor) * frac)
    return peak * (floor + (1 - floor) * (1 + math.cos(math.pi * frac)) / 2)


def test_param_groups_split_decay():
    model = Tiny()
    decay, no_decay = param_groups(model, 0.1)
    assert decay["names"] == ["embed.weight", "proj.weight", "head.weight"]
    assert no_decay["names"] == ["proj.bias", "norm.weight", "norm.bias"]
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    decay, no_decay = param_groups(model, 0.1, decay_embeddings=False)
    assert decay["names"] == ["proj.weight"]
    assert set(no_decay["names"]) == {"embed.weight", "head.weight", "proj.bias", "norm.weight", "norm.bias"}


def test_tied_weights_appear_once():
    from distributed_helpers import build_tiny

    model, _ = build_tiny()
    opt = build_optimizer(model, OptimConfig())
    params = [p for g in opt.param_groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(model.parameters()))
    norms = [p for p in opt.param_groups[1]["params"]]
    assert all(p.ndim == 1 for p in norms) and len(norms) == 2 * 2 + 1  # 2 per layer + final


SCHEDULES = [
    SchedulerConfig(kind="cosine", warmup_steps=3, total_steps=10, min_lr_ratio=0.1),
    SchedulerConfig(kind="linear", warmup_steps=2, total_steps=8, min_lr_ratio=0.0),
    SchedulerConfig(kind="constant", warmup_steps=4, total_steps=6),
    SchedulerConfig(kind="cosine", warmup_steps=0, total_steps=5, min_lr_ratio=0.2),
]


@pytest.mark.parametrize("sched_cfg", SCHEDULES, ids=lambda c: f"{c.kind}-w{c.warmup_steps}")
def test_configured_lr_is_what_adamw_used(sched_cfg):
    torch.manual_seed(0)
    model = Tiny().double()
    cfg = OptimConfig(lr=0.05, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.3)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, sched_cfg)
    params = [p for g in opt.param_groups for p in g["params"]]
    decays = [g["weight_decay"] for g in opt.param_groups for _ in g["params"]]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for s in range(sched_cfg.total_steps + 3):
        lr = expected_lr(s, cfg.lr, sched_cfg.kind, sched_cfg.warmup_steps, sched_cfg.total_steps,
                         sched_cfg.min_lr_ratio)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([lr] * len(opt.param_groups), rel=1e-12)
        ids = torch.randint(0, 5, (6,))
        model(ids).pow(2).mean().backward()
        before = [p.detach().clone() for p in params]
        grads = [p.grad.clone() for p in params]
        opt.step()
        sched.step()
        opt.zero_grad()
        t = s + 1
        for i, p in enumerate(params):  # AdamW, decoupled decay, from the definition
            m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * grads[i]
            v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * grads[i] ** 2
            m_hat, v_hat = m[i] / (1 - cfg.beta1 ** t), v[i] / (1 - cfg.beta2 ** t)
            want = before[i] * (1 - lr * decays[i]) - lr * m_hat / (v_hat.sqrt() + cfg.eps)
            torch.testing.assert_close(p.detach(), want, rtol=1e-12, atol=1e-14)


def test_scheduler_state_round_trips():
    cfg = SchedulerConfig(kind="cosine", warmup_steps=2, total_steps=20)
    opt_a = build_optimizer(Tiny(), OptimConfig(lr=1.0))
    sched_a = build_scheduler(opt_a, cfg)
    for _ in range(7):
        opt_a.step()
        sched_a.step()
    opt_b = build_optimizer(Tiny(), OptimConfig(lr=1.0))
    sched_b = build_scheduler(opt_b, cfg)
    opt_b.load_state_dict(opt_a.state_dict())
    sched_b.load_state_dict(sched_a.state_dict())
    for _ in range(5):
        for o, s in ((opt_a, sched_a), (opt_b, sched_b)):
            o.step()
            s.step()
        assert sched_a.get_last_lr() == sched_b.get_last_lr()
    assert sched_b.get_last_lr()[0] == pytest.approx(expected_lr(12, 1.0, "cosine", 2, 20, 0.1))


def test_config_wins_over_the_checkpoint_on_resume():
    """optim.lr / schedule / betas changed on resume: loading the checkpoint restores the old
    values; reapply_config sets the config's, keeps the step, and reports each change."""
    old_s, new_s = (SchedulerConfig(kind="cosine", warmup_steps=2, total_steps=20),
                    SchedulerConfig(kind="linear", warmup_steps=2, total_steps=40))
    opt_a = build_optimizer(Tiny(), OptimConfig(lr=1.0))
    sched_a = build_scheduler(opt_a, old_s)
    for _ in range(7):
        opt_a.step()
        sched_a.step()
    new_o = OptimConfig(lr=0.5, beta1=0.8)
    opt_b = build_optimizer(Tiny(), new_o)
    sched_b = build_scheduler(opt_b, new_s)
    opt_b.load_state_dict(opt_a.state_dict())
    sched_b.load_state_dict(sched_a.state_dict())
    assert sched_b.base_lrs == [1.0, 1.0]            # what the checkpoint said: the bug
    changes = reapply_config(opt_b, sched_b, new_o, new_s)
    assert any(c.startswith("optim.lr: 1 -> 0.5") for c in changes), changes
    assert any(c.startswith("scheduler:") for c in changes)
    assert any(c.startswith("optim.beta1/beta2") for c in changes)
    assert sched_b.last_epoch == 7
    assert opt_b.param_groups[0]["lr"] == pytest.approx(expected_lr(7, 0.5, "linear", 2, 40, 0.1))
    opt_b.step()
    sched_b.step()
    assert sched_b.get_last_lr()[0] == pytest.approx(expected_lr(8, 0.5, "linear", 2, 40, 0.1))
    assert reapply_config(opt_b, sched_b, new_o, new_s) == []   # unchanged config: no-op


@pytest.mark.parametrize("kwargs, key", [
    ({"warmup_steps": -1}, "warmup_steps"), ({"warmup_steps": 5, "total_steps": 4}, "total_steps"),
    ({"min_lr_ratio": 1.5}, "min_lr_ratio"), ({"total_steps": 0}, "total_steps")])
def test_bad_scheduler_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        build_scheduler(build_optimizer(Tiny(), OptimConfig()), SchedulerConfig(**kwargs))


@pytest.mark.parametrize("kwargs, key", [({"lr": 0.0}, "optim.lr"), ({"beta2": 1.0}, "beta2"),
                                         ({"weight_decay": -1.0}, "weight_decay")])
def test_bad_optim_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        build_optimizer(Tiny(), OptimConfig(**kwargs))


def test_clip_grad_norm_matches_definition():
    model = Tiny().double()
    model(torch.arange(5)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    assert clip_grad_norm(model, 0.0) == pytest.approx(norm, rel=1e-12)  # measure only
    assert clip_grad_norm(model, norm / 4) == pytest.approx(norm, rel=1e-12)
    clipped = [p.grad for p in model.parameters() if p.grad is not None]
    for g, c in zip(grads, clipped):
        torch.testing.assert_close(c, g / 4, rtol=1e-5, atol=0)  # clip coefficient has an eps


def test_auto_adamw_is_fused_on_plain_tensors_and_matches_foreach():
    """``implementation: auto`` takes torch's fused AdamW kernel for plain CPU parameters (about
    3x faster than foreach on CPU, benchmarks/RESULTS.md); its updates equal the multi-tensor
    kernel's to float32 rounding over several steps (weight decay on one group, not the other)."""
    from xdistill.train.optim import auto_implementation

    def run(impl: str) -> dict:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16), nn.LayerNorm(16))
        opt = build_optimizer(model, OptimConfig(lr=1e-2, implementation=impl))
        for step in range(5):
            torch.manual_seed(100 + step)
            loss = model(torch.randint(0, 50, (4, 7))).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        return {"opt": opt, "weights": {k: v.detach().clone() for k, v in
                                        model.state_dict().items()}}

    auto, foreach = run("auto"), run("foreach")
    assert auto["opt"].defaults["fused"] and not foreach["opt"].defaults["fused"]
    # Adam divides by sqrt(v): a few ulps between the kernels grow over 5 steps at lr 1e-2 (on an
    # AMD EPYC: fused vs foreach 2.2e-5 at most, each 2.4e-3 from a float64 run), so the bound is
    # 1% of one step; a wrong bias correction or decay would differ by a whole step (1e-2)
    for k, w in foreach["weights"].items():
        torch.testing.assert_close(auto["weights"][k], w, rtol=1e-4, atol=1e-4)
    meta = [{"params": [nn.Parameter(torch.empty(3, device="meta"))]}]
    assert auto_implementation(meta) == "foreach"          # no fused kernel there
    half_cpu = [{"params": [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))]}]
    assert auto_implementation(half_cpu) == "fused"


def _checkpointed(optim_cfg: OptimConfig, sched_cfg: SchedulerConfig) -> tuple[dict, dict]:
    """Optimizer and scheduler states after 2 AdamW steps on Tiny (a checkpoint's contents)."""
    torch.manual_seed(0)
    model = Tiny()
    opt = build_optimizer(model, optim_cfg)
    sched = build_scheduler(opt, sched_cfg)
    for _ in range(2):
        model(torch.arange(5)).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return opt.state_dict(), sched.state_dict()


def _resumed(states: tuple[dict, dict], optim_cfg: OptimConfig, sched_cfg: SchedulerConfig):
    torch.manual_seed(0)
    model = Tiny()
    opt = build_optimizer(model, optim_cfg)
    sched = build_scheduler(opt, sched_cfg)
    opt.load_state_dict(states[0])
    sched.load_state_dict(states[1])
    return model, opt, sched, reapply_config(opt, sched, optim_cfg, sched_cfg)


@pytest.mark.parametrize("old, new", [(0.0, 0.1), (0.1, 0.0), (0.1, 0.05), (0.0, 0.0)])
def test_resume_gives_the_decay_group_the_configs_weight_decay(old, new):
    """A checkpoint written with optim.weight_decay 0 has its decay group at 0, like the no-decay
    group: resumed with 0.1 the decay group once stayed at 0 and no change was logged. The groups
    are told apart by role: decay -> the config's value (reported), no-decay -> 0."""
    sched_cfg = SchedulerConfig(total_steps=10)
    states = _checkpointed(OptimConfig(lr=0.1, weight_decay=old), sched_cfg)
    model, opt, _, changes = _resumed(states, OptimConfig(lr=0.1, weight_decay=new), sched_cfg)
    assert [g["weight_decay"] for g in opt.param_groups] == [new, 0.0]
    assert changes == ([f"optim.weight_decay: {old:g} -> {new:g}"] if old != new else [])
    # the next update decays the matrices by lr * weight_decay, the norm/bias not at all
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in
             model.named_parameters() if p in opt.state}
    lr = opt.param_groups[0]["lr"]
    opt.step()
    for name, p in model.named_parameters():
        if name not in state:
            continue
        decay = new if name in ("embed.weight", "proj.weight", "head.weight") else 0.0
        st, (b1, b2) = state[name], (opt.param_groups[0]["betas"])
        t = float(st["step"]) + 1
        m, v = b1 * st["exp_avg"], b2 * st["exp_avg_sq"]
        want = before[name] * (1 - lr * decay) - lr * (m / (1 - b1 ** t)) / (
            (v / (1 - b2 ** t)).sqrt() + opt.param_groups[0]["eps"])
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-7)


def _kernel(group: dict) -> tuple:
    return group["fused"], group["foreach"]


@pytest.mark.parametrize("old, new", [("fused", "for_loop"), ("for_loop", "fused"),
                                      ("foreach", "fused"), ("fused", "foreach")])
def test_resume_keeps_the_configured_adamw_kernel(old, new):
    """``load_state_dict`` restores the checkpoint's fused/foreach flags, so a resume once ran the
    checkpoint's AdamW kernel whatever optim.implementation said: the flags go back to what the
    builder chose for this run (reported), and the step counts to where that kernel keeps them."""
    sched_cfg = SchedulerConfig(total_steps=10)
    states = _checkpointed(OptimConfig(implementation=old), sched_cfg)
    fresh = build_optimizer(Tiny(), OptimConfig(implementation=new))
    _, opt, _, changes = _resumed(states, OptimConfig(implementation=new), sched_cfg)
    assert [_kernel(g) for g in opt.param_groups] == [_kernel(g) for g in fresh.param_groups]
    assert f"optim.implementation: {old} -> {new}" in changes, changes
    for p, st in opt.state.items():
        assert st["step"].dtype == torch.float32 and st["step"].device == p.device
    opt.step()   # the configured kernel accepts the loaded state
    _, same, _, unchanged = _resumed(states, OptimConfig(implementation=old), sched_cfg)
    assert unchanged == [] and [_kernel(g) for g in same.param_groups] == [
        _kernel(g) for g in build_optimizer(Tiny(), OptimConfig(implementation=old)).param_groups]
