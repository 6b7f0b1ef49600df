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


@dataclass
class Cfg:
    # learning rate
    lr: float = 0.1
    # a scale
    scale: float = 1.0
    # steps
    steps: int = 1
    # a name
    name: str = ""


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


def test_yaml_12_floats_in_files_and_overrides(tmp_path):
    """``1e-3`` is a float in YAML 1.2 (PyYAML's 1.1 rules read a string); integers stay int."""
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-3\nsteps: 12\nname: 2e5x\n")
    cfg = load_config(Cfg, path, ["scale=-2E-4"])
    assert cfg.lr == 0.001 and cfg.scale == -0.0002 and cfg.steps == 12 and cfg.name == "2e5x"
    assert isinstance(cfg.steps, int)


def test_duplicate_yaml_key_names_both_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("lr: 0.1\nsteps: 3\nlr: 0.2\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: duplicate key 'lr' at line 3 \(first at line 1\)"):
        load_config(Cfg, path)


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("lr: 0.1\nsteps: [1, 2\nname: x\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3:\d+: not valid YAML"):
        load_config(Cfg, path)


def test_override_error_blames_the_override_not_the_file(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("lr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, path, ["steps=many"])
    assert str(err.value).startswith("command-line override 'steps=many': steps: expected int")
    assert "ok.yaml" not in str(err.value)
    path.write_text("steps: many\n")
    with pytest.raises(ConfigError, match=r"steps: expected int, got 'many' \(in .*ok.yaml\)"):
        load_config(Cfg, path)


def test_describe_documents_the_fields_of_an_empty_list_of_sections():
    """``teachers: []`` by default: config show once hid every teacher field."""
    text = describe(RootCfg())
    assert "teachers: []\n# each entry of teachers:\n#   - # teacher name\n#     name: t\n" \
           "#     # loss weight\n#     weight: 1.0" in text
    yaml_safe = __import__("yaml").safe_load(text)   # still valid YAML
    assert yaml_safe["teachers"] == []


def test_config_show_lists_teacher_fields(capsys):
    from xdistill.cli import main

    assert main(["config", "show", "offpolicy"]) == 0
    out = capsys.readouterr().out
    for field_name in ("tokenizer:", "worker:", "placement:", "projection:", "kind:"):
        assert f"#     {field_name}" in out or f"#       {field_name}" in out, field_name


@pytest.mark.parametrize("raw, expected", [
    ("1e-3", 1e-3), ("1E5", 1e5), (".5", 0.5), ("-2e-4", -2e-4), ("+1e3", 1e3), ("1.e-3", 1e-3),
    (".inf", float("inf")), ("-.inf", float("-inf")), ("inf", float("inf")),
    ("-Infinity", float("-inf")), ("5", 5.0)])
def test_float_spellings_in_a_file_and_on_the_command_line(tmp_path, raw, expected):
    """What a Python user types for a float field is a float, from a file and from an override."""
    assert load_config(Cfg, write(tmp_path, f"lr: {raw}\n")).lr == expected
    assert load_config(Cfg, None, [f"lr={raw}"]).lr == expected
    nan = load_config(Cfg, None, ["lr=nan"]).lr
    assert nan != nan
    assert load_config(Cfg, None, ["name=inf"]).name == "inf"   # a str field keeps the word


def test_yaml_merge_keys_work_and_a_duplicate_on_one_line_names_columns(tmp_path):
    path = write(tmp_path, "teachers:\n  - &t {name: a, weight: 2.0}\n  - <<: *t\n"
                           "    name: b\n")
    cfg = load_config(RootCfg, path)
    assert [(t.name, t.weight) for t in cfg.teachers] == [("a", 2.0), ("b", 2.0)]  # explicit wins
    path.write_text("loss: {kind: rkl, kind: jsd}\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml: duplicate key 'kind' at line 1, column 19 "
                                          r"\(first at line 1, column 8\)"):
        load_config(RootCfg, path)


def test_config_show_takes_overrides_after_the_config_option(capsys, tmp_path):
    """The usage line reads ``[--config FILE] [key=value ...]``: that order was 'unrecognized'."""
    from xdistill.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-2\n")
    assert main(["config", "show", "offpolicy", "--config", str(path), "optim.lr=1e-3",
                 "train.steps=7"]) == 0
    out = capsys.readouterr().out
    assert "\n  lr: 0.001\n" in out and "\n  steps: 7\n" in out
    with pytest.raises(SystemExit) as exit_:   # argparse's own usage error, exit 2
        main(["config", "show", "offpolicy", "--config", str(path), "--bogus"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_range_error_after_loading_names_the_override_or_the_file(tmp_path, capsys):
    """`optim.lr=-1` failed a range check in the trainer with no word of where the value came from."""
    from xdistill.cli import main

    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  lr: -1\n")
    assert main(["train", "offpolicy", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"xdistill: error: optim.lr: must be > 0, got -1.0 (in {path})\n"
    assert main(["train", "offpolicy", "--config", str(path), "optim.lr=0.1",
                 "train.steps=0"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("train.steps must be >= 1, got 0 (set by command-line override "
                        "'train.steps=0')\n") and err.count("\n") == 1


def test_yaml_booleans_are_only_true_and_false(tmp_path):
    """YAML 1.2 booleans: ``train.wandb: off`` (the documented default) is the string "off", as in
    a file as on the command line; true/false stay booleans. YAML 1.1 read off/on/yes/no as
    booleans, so `wandb: off` was refused as "got False"."""
    from xdistill.train.config import OffPolicyConfig

    cfg = load_config(OffPolicyConfig, None, ["train.wandb=off", "data.shuffle=false"])
    assert cfg.train.wandb == "off" and cfg.data.shuffle is False
    path = write(tmp_path, "train:\n  wandb: off\ndata:\n  shuffle: True\n")
    cfg = load_config(OffPolicyConfig, path, [])
    assert cfg.train.wandb == "off" and cfg.data.shuffle is True
    with pytest.raises(ConfigError, match="data.shuffle"):
        load_config(OffPolicyConfig, None, ["data.shuffle=yes"])


def test_string_fields_keep_the_text_yaml_reads_as_a_number(tmp_path):
    """A ``str`` field keeps what the user wrote: YAML 1.1 reads ``0123`` as octal 83, ``1_000`` as
    1000, ``0x1F`` as 31, ``1:30`` as 90 and ``1.10`` as 1.1, so a revision, a run name or a
    folder named like a number was silently renamed. Numbers stay numbers in number fields."""

    @dataclass
    class Named:
        # a name
        name: str = ""
        # an optional name
        tag: str | None = None
        # named values
        table: dict[str, int] = field(default_factory=dict)
        # anything
        extra: dict = field(default_factory=dict)
        # steps
        steps: int = 1
        # a scale
        scale: float = 1.0

    for text in ["0123", "1_000", "0x1F", "1:30", "1.10", "1e3", "007"]:
        path = write(tmp_path, f"name: {text}\ntag: {text}\ntable:\n  {text}: 0x0F\n")
        cfg = load_config(Named, path, [])
        assert (cfg.name, cfg.tag, list(cfg.table)) == (text, text, [text]), text
        assert cfg.table[text] == 15 and type(cfg.table[text]) is int
        cfg = load_config(Named, None, [f"name={text}", f"tag={text}"])
        assert (cfg.name, cfg.tag) == (text, text), text
    cfg = load_config(Named, write(tmp_path, "steps: 1_000\nscale: 1.50\nextra: {a: [1, 2.5]}\n"), [])
    assert (cfg.steps, cfg.scale) == (1000, 1.5) and type(cfg.steps) is int
    assert type(cfg.scale) is float and cfg.extra == {"a": [1, 2.5]}
    assert [type(v) for v in cfg.extra["a"]] == [int, float]
    __import__("yaml").safe_dump(to_dict(cfg))  # plain Python values only: dumps without error


def test_integers_are_read_as_yaml_1_2_reads_them(tmp_path):
    """``train.steps=010`` is ten: YAML 1.1 read a leading zero as octal (8) and ``1:30`` as a
    base-60 integer (90); YAML 1.2 reads decimal and text. Prefixed bases and ``1_000`` stay."""
    from xdistill.train.config import OffPolicyConfig

    for text, want in [("010", 10), ("007", 7), ("0o17", 15), ("0x1F", 31), ("0b101", 5),
                       ("1_000", 1000), ("-3", -3)]:
        cfg = load_config(OffPolicyConfig, None, [f"train.seed={text}"])
        assert cfg.train.seed == want and type(cfg.train.seed) is int, text
        cfg = load_config(OffPolicyConfig, write(tmp_path, f"train:\n  seed: {text}\n"), [])
        assert cfg.train.seed == want, text
    with pytest.raises(ConfigError, match="train.steps"):
        load_config(OffPolicyConfig, None, ["train.steps=1:30"])


def test_overrides_reach_into_free_form_model_config(tmp_path):
    """``student.model_config`` is a free-form mapping (``dict[str, Any]``): a dotted override
    reaches nested mappings and list items in it, as it does in a file; a scalar is still not a
    section."""
    from xdistill.student.config import StudentConfig

    path = tmp_path / "s.yaml"
    path.write_text("model_config:\n  rope_scaling: {factor: 1.0}\n  layer_types: [full, sliding]\n")
    cfg = load_config(StudentConfig, path, ["model_config.rope_scaling.factor=2.0",
                                            "model_config.rope_scaling.rope_type=linear",
                                            "model_config.layer_types.1=full",
                                            "model_config.extra.deep.key=3"])
    assert cfg.model_config == {"rope_scaling": {"factor": 2.0, "rope_type": "linear"},
                                "layer_types": ["full", "full"], "extra": {"deep": {"key": 3}}}
    with pytest.raises(ConfigError, match="model_config.rope_scaling.factor is not a section"):
        load_config(StudentConfig, path, ["model_config.rope_scaling.factor.x=1"])
    with pytest.raises(ConfigError, match="index 5 is out of range"):
        load_config(StudentConfig, path, ["model_config.layer_types.5=full"])
