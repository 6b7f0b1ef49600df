"""xdistill: cross-tokenizer distillation of language models.

Heavy dependencies (torch, transformers, numba, ray) are imported lazily by the modules that need
them, so ``import xdistill`` stays cheap.
"""

__version__ = "0.1.0"
