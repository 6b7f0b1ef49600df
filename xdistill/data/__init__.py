"""Data stage: prepare arrow shards, read them memory-mapped, pack windows, collate DistillBatches.

``prepare`` (``xdistill data prepare``) -> ``DocumentSource`` -> ``PackedDataset`` (sharded by rank
and worker, resumable) -> ``CrossTokenizerCollator`` (in DataLoader workers) -> ``DistillBatch``.
``build_loader`` wires them into a torchdata ``StatefulDataLoader``.
"""

from xdistill.data.batch import BatchStats, DistillBatch, TeacherView
from xdistill.data.collator import CrossTokenizerCollator, TeacherTokenization
from xdistill.data.config import DataConfig
from xdistill.data.dataset import PackedDataset
from xdistill.data.loader import build_collator, build_dataset, build_loader
from xdistill.data.packing import Segment, Window
from xdistill.data.prepare import prepare
from xdistill.data.source import DocumentSource

__all__ = ["BatchStats", "CrossTokenizerCollator", "DataConfig", "DistillBatch", "DocumentSource",
           "PackedDataset", "Segment", "TeacherTokenization", "TeacherView", "Window", "build_collator",
           "build_dataset", "build_loader", "prepare"]
