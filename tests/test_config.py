"""Strict YAML config loading, dotted overrides, documentation of every field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from xdistill.config import describe, field_docs, load_config, to_dict, undocumented_fields
from xdistill.errors import ConfigError


@dataclass
class LossCfg:
    # softmax temperature applied to both sides
    temperature: float = 1.0
    # divergence to use
    kind: Literal["fkl", "rkl", "jsd"] = "fkl"


@dataclass
class TeacherCfg:
    # teacher name
    name: str = "t"
    # loss weight
    weight: float = 1.0


@dataclass
class RootCfg:
    # random seed
    seed: int = 0
    # loss section
    loss: LossCfg = field(default_factory=LossCfg)
    # teachers, in order
    teachers: list[TeacherCfg] = field(default_factory=list)
    # optional output directory
    out_dir: str | None = None
    # run evaluation
    evaluate: bool = True


def write(tmp_path, text):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_load_yaml_and_overrides(tmp_path):
    path = write(tmp_path, "seed: 3\nloss:\n  temperature: 2\nteachers:\n  - name: a\n  - name: b\n")
    cfg = load_config(RootCfg, path, ["loss.kind=jsd", "teachers.1.weight=0.25", "out_dir=runs/x"])
    assert cfg.seed == 3 and cfg.loss.temperature == 2.0 and isinstance(cfg.loss.temperature, float)
    assert cfg.loss.kind == "jsd"
    assert [t.name for t in cfg.teachers] == ["a", "b"] and cfg.teachers[1].weight == 0.25
    assert cfg.out_dir == "runs/x"
    assert to_dict(cfg)["teachers"][0] == {"name": "a", "weight": 1.0}


def test_unknown_key_names_key_and_allowed(tmp_path):
    path = write(tmp_path, "loss:\n  temprature: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(RootCfg, path)
    msg = str(err.value)
    assert "loss.temprature" in msg and "temperature" in msg and "kind" in msg


def test_unknown_override_key():
    with pytest.raises(ConfigError, match="'loss.temp'.*allowed: temperature, kind"):
        load_config(RootCfg, None, ["loss.temp=2"])


@pytest.mark.parametrize("override, expected", [
    ("seed=abc", "seed: expected int, got 'abc'"),
    ("loss.temperature=hot", "loss.temperature: expected float"),
    ("evaluate=3", "evaluate: expected bool"),
    ("loss.kind=kl", "loss.kind: expected one of 'fkl', 'rkl', 'jsd'"),
])
def test_bad_override_type(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        load_config(RootCfg, None, [override])


def test_override_index_out_of_range_and_malformed():
    with pytest.raises(ConfigError, match="out of range"):
        load_config(RootCfg, None, ["teachers.0.weight=1"])
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(RootCfg, None, ["seed"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RootCfg, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(RootCfg, write(tmp_path, "seed: [1,\n"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(RootCfg, write(tmp_path, "- 1\n- 2\n"))


def test_field_docs_and_describe():
    docs = field_docs(LossCfg)
    assert docs["temperature"] == "softmax temperature applied to both sides"
    assert undocumented_fields(RootCfg) == []
    text = describe(load_config(RootCfg, None, []))
    assert "# softmax temperature applied to both sides" in text and "temperature: 1.0" in text


def test_undocumented_field_is_reported():
    @dataclass
    class Bad:
        x: int = 0

    assert undocumented_fields(Bad) == ["Bad.x"]
