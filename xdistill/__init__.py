"""xdistill: cross-tokenizer distillation of language models.

Heavy dependencies (torch, transformers, numba, ray) are imported lazily by the modules that need
them, so ``import xdistill`` stays cheap.

Threads: unless the environment sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, importing
xdistill before torch sets ``GOMP_SPINCOUNT=1000``: an idle OpenMP worker spins ~1000 iterations
for the next parallel region, then sleeps. GNU OpenMP's own default spins ~300,000; when another
process holds a core, every parallel region then waits for a descheduled spinner, and a step
collapses (two identical SmolLM2-135M training jobs on 2 cores: 2.2 s/step instead of 0.94 in
bf16, over 20 s instead of 2.5 in float32). Never spinning (``OMP_WAIT_POLICY=PASSIVE``, the earlier default) is safest on shared
cores but pays a wake-up per region on cores that are yours: the real-pair step 1.10x (float32)
and 1.30x (bf16) slower than 1000 spins, which is within 3% of spinning without limit there
and 1.08-1.27x from passive when the cores are shared (``benchmarks/real/step_wait.md``). Set
either variable yourself to choose (``OMP_WAIT_POLICY=PASSIVE`` on busy shared machines,
``ACTIVE`` for OpenMP's own default).

The Python API (``docs/python_api.md``), imported on first use::

    cfg = xdistill.load_config(xdistill.OffPolicyConfig, "configs/offpolicy_tiny_cpu.yaml",
                               ["train.steps=50"])       # or config_from_dict(cls, {...})
    final = xdistill.run_offpolicy(cfg)                  # -> the final step's metrics
    xdistill.run_onpolicy(cfg)                           # an OnPolicyConfig
    xdistill.evaluate_offpolicy(cfg)                     # a run's held-out figures at step 0
    xdistill.model_bits_per_byte(model, tok, paths)      # any causal LM (load_causal_lm)
    proj = xdistill.build_projection(student_tok, teacher_tok, xdistill.BuildConfig())
    res = xdistill.align_pair(s_ids, t_ids, student_tok.table, teacher_tok.table)
    xdistill.projected_kl(student_logits, teacher_logits, xdistill.ChunkAlignment.from_view(res), W)
"""

import importlib as _importlib
import os as _os
import sys as _sys

# set before torch (its GNU OpenMP reads them once, when it loads); see the module doc
if ("torch" not in _sys.modules and "numba" not in _sys.modules
        and not any(k in _os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))):
    _os.environ["GOMP_SPINCOUNT"] = "1000"

__version__ = "0.1.0"

#: public name -> "module:attribute", imported on first access (``import xdistill`` stays cheap)
_API = {
    # configs and training
    "load_config": "xdistill.config:load_config",
    "config_from_dict": "xdistill.config:from_dict",
    "OffPolicyConfig": "xdistill.train.config:OffPolicyConfig",
    "OnPolicyConfig": "xdistill.train.onpolicy_config:OnPolicyConfig",
    "run_offpolicy": "xdistill.train.offpolicy:run_offpolicy",
    "run_onpolicy": "xdistill.train.onpolicy:run_onpolicy",
    # evaluation and models
    "evaluate_offpolicy": "xdistill.train.offpolicy:evaluate_offpolicy",
    "model_bits_per_byte": "xdistill.train.evaluate:model_bits_per_byte",
    "load_causal_lm": "xdistill.student.model:load_causal_lm",
    "export_hf": "xdistill.student.model:export_hf",
    # tokenizers
    "load_tokenizer": "xdistill.tokenization.load:load_tokenizer",
    "Tokenizer": "xdistill.tokenization.tokenizer:Tokenizer",
    # projections
    "BuildConfig": "xdistill.projection.build:BuildConfig",
    "build_projection": "xdistill.projection.build:build_projection",
    "save_projection": "xdistill.projection.artifact:save_projection",
    "load_projection": "xdistill.projection.artifact:load_projection",
    # the aligner
    "align_pair": "xdistill.align.api:align_pair",
    "align_batch": "xdistill.align.api:align_batch",
    "AlignmentResult": "xdistill.align.api:AlignmentResult",
    # losses, for one's own training loop
    "ChunkAlignment": "xdistill.losses.chunks:ChunkAlignment",
    "projection_from_csr": "xdistill.losses.cross:projection_from_csr",
    "projected_kl": "xdistill.losses.cross:projected_kl",
    "exact_kl": "xdistill.losses.cross:exact_kl",
    "alm": "xdistill.losses.alm:alm",
    "uld": "xdistill.losses.uld:uld",
    "gold_hybrid": "xdistill.losses.uld:gold_hybrid",
    "forward_kl": "xdistill.losses.divergences:forward_kl",
    "reverse_kl": "xdistill.losses.divergences:reverse_kl",
    "jsd": "xdistill.losses.divergences:jsd",
    "cross_entropy": "xdistill.losses.divergences:cross_entropy",
    "MultiTeacherLoss": "xdistill.losses.multi_teacher:MultiTeacherLoss",
    # errors
    "XDistillError": "xdistill.errors:XDistillError",
    "ConfigError": "xdistill.errors:ConfigError",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    """The public API, imported on first use (module docstring; ``docs/python_api.md``)."""
    target = _API.get(name)
    if target is None:
        raise AttributeError(f"module 'xdistill' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(_importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
