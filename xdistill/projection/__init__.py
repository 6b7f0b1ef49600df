"""Offline sparse token-projection matrices ``W`` (rows = student tokens, columns = teacher tokens).

``build_projection(student, teacher, BuildConfig(...))`` composes the exact / multitoken / corpus
methods (:mod:`.methods`, :mod:`.corpus`, :mod:`.build`) directly in sparse form;
``save_projection``/``load_projection`` (:mod:`.artifact`) write and validate the ``.npz`` + JSON
sidecar pair; :func:`build_byteprefix_map` (:mod:`.byteprefix`) is the static byte-prefix map of
the BPM / ESCD losses; :mod:`.audit` and :mod:`.plot` report coverage. CLI: ``xdistill projection``.
"""

from xdistill.projection.artifact import (
    DIRECTION, SOURCE_NAMES, Projection, load_projection, save_projection, sidecar_path)
from xdistill.projection.build import BuildConfig, build_projection, parse_methods
from xdistill.projection.byteprefix import BytePrefixMap, build_byteprefix_map

__all__ = ["BuildConfig", "BytePrefixMap", "DIRECTION", "Projection", "SOURCE_NAMES",
           "build_byteprefix_map", "build_projection", "load_projection", "parse_methods",
           "save_projection", "sidecar_path"]
