"""``benchmarks/onpolicy_engines.py`` builds valid trainer configs for every arm it compares.

The benchmark itself needs vLLM (``.venv-vllm``); its configs do not, so they are checked here:
each (recipe, dtype, backend) gives an ``OnPolicyConfig`` the strict loader accepts, with the
dtypes the report names and the same prompts and budget for both backends.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from xdistill.config import from_dict
from xdistill.train.onpolicy_config import OnPolicyConfig

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_onpolicy_engines",
                                               REPO / "benchmarks" / "onpolicy_engines.py")
engines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engines)


def _args(recipe: str, dtype: str, compile_: bool = False) -> argparse.Namespace:
    return argparse.Namespace(recipe=recipe, dtype=dtype, compile=compile_, steps=3, batch=8,
                              new=64)


@pytest.mark.parametrize("recipe", ["real", "tiny"])
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_both_backends_get_the_same_run_but_the_engine(tmp_path, recipe, dtype):
    cfgs = {b: engines.config(b, _args(recipe, dtype), tmp_path / "r0" / b) for b in engines.BACKENDS}
    parsed = {b: from_dict(OnPolicyConfig, c) for b, c in cfgs.items()}
    hf, vllm = parsed["hf"], parsed["vllm"]
    assert (hf.rollout.backend, vllm.rollout.backend) == ("hf", "vllm")
    want = "float32" if dtype == "float32" else "auto"
    for cfg in (hf, vllm):
        assert cfg.student.param_dtype == want
        assert all(t.worker.dtype == want for t in cfg.teachers)
        assert cfg.train.steps == 3 and cfg.checkpoint.every == 0
    assert vllm.rollout.vllm_dtype == ("float32" if dtype == "float32" else "bfloat16")
    assert vllm.rollout.vllm_enforce_eager
    # everything but the backend and the out folder is the same for both
    for cfg in cfgs.values():
        cfg["rollout"]["backend"] = cfg["train"]["out_dir"] = ""
    assert cfgs["hf"]["prompts"] == cfgs["vllm"]["prompts"]
    assert cfgs["hf"]["student"] == cfgs["vllm"]["student"]
    assert cfgs["hf"]["teachers"] == cfgs["vllm"]["teachers"]
    assert cfgs["hf"]["loss"] == cfgs["vllm"]["loss"]


def test_the_tiny_recipe_is_the_shipped_config_widened_for_vllm(tmp_path):
    from xdistill.config import load_config

    shipped = load_config(OnPolicyConfig, REPO / "configs" / "onpolicy_tiny_cpu.yaml")
    cfg = from_dict(OnPolicyConfig, engines.config("vllm", _args("tiny", "auto", True),
                                                   tmp_path / "r0" / "vllm"))
    assert cfg.prompts.batch_size == shipped.prompts.batch_size
    assert cfg.rollout.max_new_tokens == shipped.rollout.max_new_tokens
    assert [t.loss.kind for t in cfg.teachers] == [t.loss.kind for t in shipped.teachers]
    assert cfg.student.model_config["hidden_size"] // cfg.student.model_config[
        "num_attention_heads"] == 32          # vLLM's CPU attention needs head size >= 32
    assert not cfg.rollout.vllm_enforce_eager  # --compile
    assert all(Path(t.worker.model).is_dir() for t in cfg.teachers)  # built once, shared
