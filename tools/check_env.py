"""Fail loudly if the venv's torch is a CUDA build (the dev/CI venv must use the CPU wheel).

On a GPU machine, install a CUDA torch yourself and set XDISTILL_ALLOW_CUDA=1.
"""

import os
import sys

import torch

if torch.version.cuda is not None and os.environ.get("XDISTILL_ALLOW_CUDA") != "1":
    sys.exit(f"check_env: torch {torch.__version__} is a CUDA build (cuda {torch.version.cuda}); "
             "xdistill's venv must use the CPU wheel: pip install 'torch>=2.6,<2.14'")
print(f"check_env: torch {torch.__version__} (CPU build) OK")
