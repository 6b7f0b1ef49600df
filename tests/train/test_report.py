"""The start banner: one line saying what runs, where, how many steps and the out dir."""

from __future__ import annotations

import logging

from train_helpers import base_config

from xdistill.config import from_dict
from xdistill.train.config import OffPolicyConfig


def test_a_run_starts_with_one_banner_line(tmp_path, tiny_assets, caplog):
    from xdistill.train.offpolicy import run_offpolicy

    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["train"]["steps"] = 2
    logger = logging.getLogger("xdistill.train")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="xdistill"):
            run_offpolicy(from_dict(OffPolicyConfig, cfg))
            cfg["train"]["steps"] = 3                       # resumes after step 2
            run_offpolicy(from_dict(OffPolicyConfig, cfg))
    finally:
        logger.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records}.values()   # seen once or twice (propagation)
    banners = [r.getMessage() for r in records if r.getMessage().startswith("start: ")]
    assert len(banners) == 2, banners
    first, resumed = banners
    for part in ("start: train offpolicy", "student llama (fresh)", "k params",
                 "teachers cross (", "pkl, inprocess)", "same (", "forward_kl",
                 "cpu, 1 process x 1 threads", "steps 1..2 of 2", f"out {tmp_path / 'run'}"):
        assert part in first, (part, first)
    assert "steps 3..3 of 3 (resumed at step 2)" in resumed
