"""A model's own BOS default (tokenizer_config.json, GGUF metadata, the tokenizer's post-processor)
is the default of every ``add_bos`` setting; an explicit value wins, and one unlike the default is
logged once."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from xdistill.assets.paths import tokenizer_dir
from xdistill.errors import ConfigError
from xdistill.tokenization import bos as bos_mod
from xdistill.tokenization.bos import gguf_add_bos, resolve_add_bos


@pytest.fixture
def warnings_seen(caplog):
    """Warnings of xdistill.tokenization (its logger may not propagate after init_logging)."""
    logger = logging.getLogger("xdistill.tokenization")
    logger.addHandler(caplog.handler)
    bos_mod._WARNED.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="xdistill"):
            # each record once (it may reach caplog twice: this handler and propagation)
            yield lambda: [r.getMessage() for r in {id(r): r for r in caplog.records}.values()
                           if r.levelno == logging.WARNING]
    finally:
        logger.removeHandler(caplog.handler)
        bos_mod._WARNED.clear()


@pytest.mark.parametrize("name,adds", [("gemma3-270m", True), ("mistral", True), ("llama3", True),
                                       ("smollm2-135m", False), ("gpt2", False)])
def test_default_follows_the_tokenizer(get_tokenizer, name, adds):
    tok = get_tokenizer(name)
    assert tok.add_bos_default is adds, tok.add_bos_origin
    assert resolve_add_bos(None, tok, "data.add_bos") is adds
    # it is what the tokenizer itself does when asked for its special tokens
    first = tok.hf.encode("Hello", add_special_tokens=True)[0]
    assert (first == tok.bos_id) is adds


def test_llama3_rank_file_starts_with_its_bos_like_the_published_folder(get_tokenizer):
    """Llama-3's published ``tokenizer.json`` puts ``<|begin_of_text|>`` first; the asset and a
    raw ``tokenizer.model`` rank file converted by xdistill did not, so a Llama-3 student or
    teacher loaded from them trained without the BOS it was trained with. Same ids otherwise."""
    from xdistill.assets.paths import asset_dir
    from xdistill.tokenization import load_tokenizer

    folder = get_tokenizer("llama3")
    raw = load_tokenizer(str(asset_dir() / "raw" / "llama3.tiktoken"))
    for tok in (folder, raw):
        assert tok.add_bos_default is True and tok.bos_id == 128000
        assert tok.hf.encode("Hello world", add_special_tokens=True) == [128000, 9906, 1917]
        assert tok.hf.encode("Hello world", add_special_tokens=False) == [9906, 1917]
    assert raw.fingerprint == folder.fingerprint


def test_tokenizer_config_flag_wins(tmp_path):
    from xdistill.tokenization import load_tokenizer

    folder = tmp_path / "gpt2_bos"
    shutil.copytree(tokenizer_dir("gpt2"), folder)
    cfg = folder / "tokenizer_config.json"
    cfg.write_text(cfg.read_text(encoding="utf-8").replace("{", '{"add_bos_token": true,', 1),
                   encoding="utf-8")
    tok = load_tokenizer(folder)
    assert tok.add_bos_default and "tokenizer_config.json add_bos_token" in tok.add_bos_origin


def test_gguf_metadata_flag(tmp_path):
    """``tokenizer.ggml.add_bos_token`` read from a (metadata-only) GGUF file."""
    import gguf

    for flag in (True, False):
        path = tmp_path / f"m_{flag}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_add_bos_token(flag)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert gguf_add_bos(path) is flag
    plain = tmp_path / "none.gguf"
    writer = gguf.GGUFWriter(str(plain), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_add_bos(plain) is None and gguf_add_bos(tmp_path / "missing.gguf") is None


def test_override_wins_and_a_mismatch_is_logged_once(get_tokenizer, warnings_seen):
    gemma, gpt2 = get_tokenizer("gemma3-270m"), get_tokenizer("gpt2")
    assert resolve_add_bos(True, gemma, "teacher 'g' add_bos") is True      # agrees: silent
    assert warnings_seen() == []
    for _ in range(3):
        assert resolve_add_bos(False, gemma, "teacher 'g' add_bos") is False
    assert resolve_add_bos(True, gpt2, "data.add_bos") is True
    seen = warnings_seen()
    assert len(seen) == 2, seen
    assert "teacher 'g' add_bos is false, but 'gemma3-270m' adds its BOS by default" in seen[0]
    assert "data.add_bos is true, but 'gpt2' does not add a BOS by default" in seen[1]


def test_explicit_bos_without_a_bos_token_is_an_error(get_tokenizer):
    bert = get_tokenizer("bert")
    assert bert.bos_id is None and resolve_add_bos(None, bert, "data.add_bos") is False
    with pytest.raises(ConfigError, match="data.add_bos is true but tokenizer 'bert' has no BOS"):
        resolve_add_bos(True, bert, "data.add_bos")


def test_packed_windows_and_prompts_follow_the_model(get_tokenizer):
    """Unset: Gemma's windows and rollout prompts start with <bos>, SmolLM2's do not."""
    from xdistill.data.dataset import PackedDataset
    from xdistill.rollout.render import encode_prompts

    docs = ["To be, or not to be, that is the question.", "Whether 'tis nobler in the mind."]
    for name, adds in (("gemma3-270m", True), ("smollm2-135m", False)):
        tok = get_tokenizer(name)
        ds = PackedDataset(docs, tok, 16, shuffle=False, epochs=1)
        assert ds.add_bos is adds and all(w.bos is adds for w in ds)
        (ids,) = encode_prompts(tok, ["The capital of France is"], 32)
        assert (int(ids[0]) == tok.bos_id) is adds
        assert np.count_nonzero(ids == tok.bos_id) == int(adds)


def test_run_configs_resolve_every_setting(get_tokenizer, tmp_path):
    """The plan sets data.add_bos and each teacher's from its own model."""
    from types import SimpleNamespace

    from xdistill.train.teacher_plan import DistillPlan, plan_teacher, resolve_bos_settings

    def teacher(name, tok, add_bos):
        return SimpleNamespace(name=name, tokenizer=tok, add_bos=add_bos, max_len=None,
                               worker=SimpleNamespace(model=""))

    cfg = SimpleNamespace(data=SimpleNamespace(add_bos=None),
                          teachers=[teacher("gemma", "gemma3-270m", None),
                                    teacher("smol", "smollm2-135m", None),
                                    teacher("forced", "gemma3-270m", False)])
    student = get_tokenizer("smollm2-135m")
    plan = DistillPlan(student, {t.name: plan_teacher(t, i, student)
                                 for i, t in enumerate(cfg.teachers)})
    assert [tp.add_bos for tp in plan.teachers.values()] == [True, False, False]
    resolve_bos_settings(cfg, plan)
    assert cfg.data.add_bos is False
    assert [t.add_bos for t in cfg.teachers] == [True, False, False]
