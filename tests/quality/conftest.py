"""Shared tiny preparation of the quality harness (a 10x10 addition table, 1-layer teachers trained
for a few steps by the real trainer), made once per test session."""

from __future__ import annotations

import pytest

from quality_helpers import TINY_PREP


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """A prepared-assets cache root holding TINY_PREP with both teachers."""
    from toyq.prepare import prepare_all

    root = tmp_path_factory.mktemp("quality_prep")
    prepare_all(root, TINY_PREP, log=lambda *_: None)
    return root


@pytest.fixture(scope="session")
def assets(tiny_cache):
    from toyq.prepare import prepare_all

    return prepare_all(tiny_cache, TINY_PREP, log=lambda *_: None)
