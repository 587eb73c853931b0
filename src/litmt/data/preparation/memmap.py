"""The prepared cache of one split: flat token-id arrays on disk, memory-mapped for training.

One directory per split (`cache/{name}-{src}-{tgt}-{split}-{key}/`):

    src.ids  tgt.ids    all token ids of the side, concatenated (uint16 when the vocabulary
                        fits, else int32; no bos/eos)
    src.off  tgt.off    (N+1,) int64 row offsets: row i is ids[off[i]:off[i + 1]]
    src.len  tgt.len    (N,) int32 token counts (what the bucketing sampler reads)
    index               (N,) int64 position of each kept pair in its split
    meta.json           counts and dtypes; written last: the completion marker

The directory is written under a temporary name and renamed when complete, so a half-written
cache is never read, and a directory without `meta.json` is rebuilt, never read; every rank
of a node maps the same files (one copy in the page cache).

The raw text of a split (`TextPairs`: the training split under subword sampling, which
re-encodes it every epoch, `litmt.data.preparation.subword_sampling`) is kept the same way, in its own
directory:

    src.txt  tgt.txt          the UTF-8 bytes of every pair of the split, concatenated
    src.txt.off  tgt.txt.off  (N+1,) int64 byte offsets: pair i is txt[off[i]:off[i + 1]]
    meta.json                 the pair count; written last
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from litmt.errors import DataError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_FILES = ("src.ids", "tgt.ids", "src.off", "tgt.off", "src.len", "tgt.len", "index")
_TEXT_FILES = ("src.txt", "tgt.txt", "src.txt.off", "tgt.txt.off")


def is_complete(path: Path) -> bool:
    """True when `path` holds a published cache (its completion marker exists)."""
    return (path / "meta.json").is_file()


@contextlib.contextmanager
def _disk_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DataError(
                f"no space left on the device while writing the prepared cache {path}; free "
                f"space or point data.cache_dir at a larger disk"
            ) from None
        raise DataError(f"cannot write the prepared cache {path}: {exc.strerror or exc}") from None


def _remove_stale(path: Path) -> None:
    """Delete temporary directories of `path` (``.tmp{pid}``, ``.tmp{pid}.old``) left by
    processes that no longer run."""
    for tmp in path.parent.glob(path.name + ".tmp*"):
        pid = tmp.name.rsplit(".tmp", 1)[-1].split(".")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:  # alive, owned by another user
            pass


class _DirWriter:
    """Files written under a temporary directory, published by one rename."""

    def __init__(self, path: Path, files: tuple[str, ...]) -> None:
        self.path = path
        self.tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        with _disk_errors(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale(path)
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir()
            self._f = {name: (self.tmp / name).open("wb") for name in files}

    def _write(self, name: str, array: np.ndarray) -> None:
        self._f[name].write(np.ascontiguousarray(array).tobytes())

    def _publish(self, meta: dict[str, Any]) -> None:
        """Close the files, write `meta.json` (the completion marker) and rename into place;
        when another process published first, its copy is kept. A directory in the way
        without a marker (damaged: a writer never publishes one) is replaced."""
        with _disk_errors(self.path):
            for f in self._f.values():
                f.close()
            (self.tmp / "meta.json").write_text(json.dumps(meta))
            try:
                self.tmp.rename(self.path)  # atomic publish
                return
            except OSError:
                if not self.path.exists():
                    raise  # no directory in the way: a disk error (`_disk_errors`)
                if not is_complete(self.path):
                    self._replace_incomplete()
                    return
            shutil.rmtree(self.tmp, ignore_errors=True)  # another process published first

    def _replace_incomplete(self) -> None:
        """Publish over a directory without its completion marker: move it aside (one rename,
        so readers never see a mix), rename the new one into place, delete the old."""
        log.warning("replacing %s: it has no completion marker (meta.json)", self.path)
        aside = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}.old")
        with contextlib.suppress(FileNotFoundError):  # another process moved it first
            self.path.rename(aside)
        try:
            self.tmp.rename(self.path)
        except OSError:  # another process published meanwhile: keep theirs
            shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)

    def abort(self) -> None:
        """Close and delete the temporary directory (after a failure)."""
        for f in self._f.values():
            with contextlib.suppress(OSError):
                f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class CacheWriter(_DirWriter):
    """Append tokenised pairs chunk by chunk, then `publish` the directory atomically.

    Args:
        path: the cache directory to publish.
        vocab_size: the largest vocabulary of the two sides (picks the id dtype).
    """

    def __init__(self, path: Path, vocab_size: int) -> None:
        super().__init__(path, _FILES)
        self.id_dtype = np.dtype(np.uint16 if vocab_size <= 65536 else np.int32)
        self.pairs = 0
        self.tokens = {"src": 0, "tgt": 0}
        with _disk_errors(path):
            for side in ("src", "tgt"):
                self._write(f"{side}.off", np.zeros(1, dtype=np.int64))

    def add(
        self,
        src: tuple[np.ndarray, np.ndarray],
        tgt: tuple[np.ndarray, np.ndarray],
        index: np.ndarray,
    ) -> None:
        """Append rows: each side as (flat ids, (n,) lengths); `index` (n,) split positions."""
        with _disk_errors(self.path):
            for side, (ids, lens) in (("src", src), ("tgt", tgt)):
                self._write(f"{side}.ids", ids.astype(self.id_dtype, copy=False))
                self._write(f"{side}.len", lens.astype(np.int32, copy=False))
                self._write(f"{side}.off", self.tokens[side] + np.cumsum(lens, dtype=np.int64))
                self.tokens[side] += int(lens.sum())
            self._write("index", index.astype(np.int64, copy=False))
            self.pairs += len(index)

    def publish(self, extra: dict[str, Any]) -> None:
        """Close the files, write `meta.json` (the completion marker) and rename into place;
        when another process published first, its copy is kept."""
        meta = {"version": FORMAT_VERSION, "pairs": self.pairs, "id_dtype": self.id_dtype.name,
                "tokens": self.tokens, **extra}  # fmt: skip
        self._publish(meta)


def _map(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def open_cache(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays of a published cache, memory-mapped read-only, and its metadata.

    Raises:
        DataError: the cache is corrupt (unreadable marker, missing or truncated files).
    """
    fix = "delete that directory and run again to rebuild it"
    try:
        meta = json.loads((path / "meta.json").read_text())
        n, tokens, id_dtype = int(meta["pairs"]), meta["tokens"], np.dtype(meta["id_dtype"])
        if meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {meta.get('version')}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"the prepared cache {path} is corrupt ({exc}); {fix}") from None
    shapes = {"index": (np.dtype(np.int64), n)}
    for side in ("src", "tgt"):
        shapes[f"{side}.ids"] = (id_dtype, int(tokens[side]))
        shapes[f"{side}.off"] = (np.dtype(np.int64), n + 1)
        shapes[f"{side}.len"] = (np.dtype(np.int32), n)
    arrays = {
        name: _checked_map(path, name, dtype, count, f"the prepared cache {path}", fix)
        for name, (dtype, count) in shapes.items()
    }
    return arrays, meta


def _checked_map(path: Path, name: str, dtype: np.dtype, count: int, what: str, fix: str) -> Any:
    """`_map` of ``path/name`` after checking its size is `count` items of `dtype`.

    Raises:
        DataError: the file is missing or has another size ("{what} is corrupt ...; {fix}").
    """
    f = path / name
    size = f.stat().st_size if f.is_file() else -1
    if size != dtype.itemsize * count:
        raise DataError(
            f"{what} is corrupt ({name} has {size} bytes, expected {dtype.itemsize * count}); {fix}"
        )
    return _map(f, dtype, count)


def write_text_cache(chunks: Iterable[tuple[list[str], list[str]]], path: Path) -> int:
    """Every pair of `chunks` (in order) as raw text at `path` (`TextPairs`), published
    atomically; returns the number of pairs.

    Raises:
        DataError: the disk is full or not writable.
    """
    writer = _DirWriter(path, _TEXT_FILES)
    ends = {"src": 0, "tgt": 0}
    pairs = 0
    try:
        with _disk_errors(path):
            for side in ("src", "tgt"):
                writer._write(f"{side}.txt.off", np.zeros(1, dtype=np.int64))
            for src, tgt in chunks:
                for side, lines in (("src", src), ("tgt", tgt)):
                    data = [line.encode("utf-8") for line in lines]
                    writer._f[f"{side}.txt"].write(b"".join(data))
                    sizes = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
                    writer._write(f"{side}.txt.off", ends[side] + np.cumsum(sizes))
                    ends[side] += int(sizes.sum())
                pairs += len(src)
        writer._publish({"version": FORMAT_VERSION, "pairs": pairs, "bytes": ends})
    except BaseException:
        writer.abort()
        raise
    return pairs


class TextPairs:
    """The raw (source, target) text pairs of a published text cache, memory-mapped;
    ``pairs[i]`` is pair i of the split. Pickles as its path (DataLoader workers map the
    same files, no copy).

    Raises:
        DataError: the cache is corrupt (unreadable marker, missing or truncated files).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        fix = "delete that directory and run again to rebuild it"
        try:
            meta = json.loads((path / "meta.json").read_text())
            n, size = int(meta["pairs"]), meta["bytes"]
            if meta.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {meta.get('version')}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"the text cache {path} is corrupt ({exc}); {fix}") from None
        self._arrays: dict[str, np.ndarray] = {}
        for side in ("src", "tgt"):
            for name, dtype, count in ((f"{side}.txt", np.dtype(np.uint8), int(size[side])),
                                       (f"{side}.txt.off", np.dtype(np.int64), n + 1)):  # fmt: skip
                what = f"the text cache {path}"
                self._arrays[name] = np.asarray(_checked_map(path, name, dtype, count, what, fix))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[str, str]:
        out = []
        for side in ("src", "tgt"):
            off, data = self._arrays[f"{side}.txt.off"], self._arrays[f"{side}.txt"]
            out.append(data[off[i] : off[i + 1]].tobytes().decode("utf-8"))
        return out[0], out[1]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]
