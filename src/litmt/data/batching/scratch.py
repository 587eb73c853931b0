"""Scratch arrays for the epoch plan: in memory when small, else memory-mapped files on disk.

The batch sampler's per-epoch arrays (the lengths it sorts by, the shuffled and sorted
example order) grow with the corpus: about 12 bytes per pair. For corpora of millions of
pairs `Scratch` puts them in files under a directory next to the prepared cache, so they
are page-cache pages the kernel can write back and drop, not private memory.

Each file is created with a unique name (`tempfile.mkstemp`, the process id in its prefix),
its blocks are reserved (`posix_fallocate`: a full disk is a clean error here, not a
SIGBUS on a later write through the mapping), mapped, and unlinked at once: nothing is left
on disk when the process ends, however it ends, and no two processes (DDP ranks) ever share
a file. A directory that cannot be written (a read-only shared cache) keeps the arrays in
memory, with a warning; a full disk is an error.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import tempfile
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from litmt.errors import DataError

log = logging.getLogger(__name__)

FILE_MIN_ITEMS = 1 << 18  # arrays with fewer items stay in memory (Multi30k: 29k pairs)


class Scratch:
    """Allocates (n,) arrays: `np.empty` below `min_items` or without a directory, else a
    plain ndarray over a shared, writable mapping of an unlinked file in `directory`.

    Args:
        directory: where the files go (created when needed); None = always in memory.
        min_items: smallest array put in a file (None = `FILE_MIN_ITEMS`, read at each
            allocation so tests can lower it).
    """

    def __init__(
        self, directory: str | os.PathLike[str] | None, min_items: int | None = None
    ) -> None:
        self.directory = None if directory is None else Path(directory)
        self.min_items = min_items

    def file_backed(self, n: int) -> bool:
        """Whether an array of `n` items goes to a file."""
        least = FILE_MIN_ITEMS if self.min_items is None else self.min_items
        return self.directory is not None and n > 0 and n >= least

    def empty(self, n: int, dtype: DTypeLike) -> np.ndarray:
        """An uninitialised (n,) array of `dtype`.

        Raises:
            DataError: the directory cannot hold it (no space, not writable).
        """
        dt = np.dtype(dtype)
        if not self.file_backed(n):
            return np.empty(n, dtype=dt)
        assert self.directory is not None
        size = n * dt.itemsize
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"plan-{os.getpid()}-", dir=self.directory)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # a read-only cache
                log.warning("cannot write the batch plan's scratch files in %s (%s); keeping "
                            "the plan in memory", self.directory, exc.strerror or exc)  # fmt: skip
                self.directory = None
                return np.empty(n, dtype=dt)
            raise self._error(exc) from None
        try:
            os.unlink(name)  # the mapping keeps the blocks; the name is gone at once
            os.posix_fallocate(fd, 0, size)
            buf = mmap.mmap(fd, size)  # MAP_SHARED, read/write
        except OSError as exc:
            raise self._error(exc) from None
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        return np.frombuffer(buf, dtype=dt)  # writable: the mmap is; freed with the array

    def _error(self, exc: OSError) -> DataError:
        if exc.errno == errno.ENOSPC:
            return DataError(
                f"no space left on the device for the epoch's batch plan in {self.directory}; "
                f"free space or point data.cache_dir at a larger disk"
            )
        return DataError(
            f"cannot write the epoch's batch plan in {self.directory}: {exc.strerror or exc}"
        )


def is_file_backed(arr: np.ndarray) -> bool:
    """Whether `arr` (or an array it views) lies in a memory-mapped file, not in private memory."""
    obj: object = arr
    while obj is not None:
        if isinstance(obj, np.memmap | mmap.mmap):
            return True
        obj = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
    return False
