#!/usr/bin/env python3
"""Build the tiny CPU recipe assets (``runs/tiny_assets``): see :mod:`xdistill.tiny`.

    python tools/make_tiny_models.py [--out runs/tiny_assets] [--train-steps 40]
"""

import sys

from xdistill.tiny import main

if __name__ == "__main__":
    sys.exit(main())
