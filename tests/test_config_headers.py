"""The comment headers of ``configs/*.yaml`` stay true: the commands they show name scripts,
modules and files that exist, and each tiny recipe's header names its teachers' tokenizers and
losses as the config sets them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def header(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return "\n".join(lines)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_header_commands_name_things_that_exist(path):
    text = header(path)
    for module in re.findall(r"python -m ([\w.]+)", text):
        assert importlib.util.find_spec(module) is not None, (path.name, module)
    for script in re.findall(r"python ((?:tools|benchmarks)/[\w/]+\.py)", text):
        assert (ROOT / script).is_file(), (path.name, script)
    for ref in re.findall(r"\b((?:configs|examples|benchmarks|tools)/[\w./-]+\.(?:yaml|jsonl|sh|py|md))",
                          text):
        assert (ROOT / ref).is_file(), (path.name, ref)


@pytest.mark.parametrize("name", ["offpolicy_tiny_cpu.yaml", "onpolicy_tiny_cpu.yaml"])
def test_tiny_headers_describe_their_teachers(name):
    path = ROOT / "configs" / name
    text, cfg = " ".join(header(path).split()), yaml.safe_load(path.read_text(encoding="utf-8"))
    assert "python -m xdistill.tiny" in text and "Measured" in text
    for t in cfg["teachers"]:
        family = {"qwen2": "Qwen2", "gpt2": "GPT-2"}[t["tokenizer"]]
        assert f"the {family} tokenizer" in text or f"{family}'s own tokenizer" in text
        kind = t["loss"]["kind"]
        words = {"exact_kl": "exact 1:1", "forward_kl": "forward KL", "reverse_kl": "reverse KL",
                 "k3": "k3"}[kind]
        assert words in text, (name, kind)
    assert f"runs/{path.stem}" in text or cfg["train"]["out_dir"] in text
