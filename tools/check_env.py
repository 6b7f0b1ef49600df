"""Check the venv's torch: the CPU wheel on a machine without a GPU.

A CUDA build of torch on a machine with no usable GPU means pip pulled a multi-GB CUDA wheel
instead of the CPU one (see the Makefile): that fails. On a machine with a GPU a CUDA build is
what you want, and passes (``XDISTILL_ALLOW_CUDA=1`` also forces a pass).
"""

import os
import sys

import torch


def main() -> int:
    if torch.version.cuda is None:
        print(f"check_env: torch {torch.__version__} (CPU build) OK")
        return 0
    if torch.cuda.is_available() or os.environ.get("XDISTILL_ALLOW_CUDA") == "1":
        print(f"check_env: torch {torch.__version__} (CUDA {torch.version.cuda}) with "
              f"{torch.cuda.device_count()} GPU(s) OK")
        return 0
    print(f"check_env: torch {torch.__version__} is a CUDA build (cuda {torch.version.cuda}) but "
          "no GPU is usable here; xdistill's CPU venv must use the CPU wheel: "
          "pip install 'torch>=2.6,<2.14'", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
