"""What every export shares, whatever its format: the error it raises (`ExportError`), the
refusal to overwrite what is not an export (`check_replaceable`), writing into a staged
directory that replaces the target only when complete (`staged_directory`), file digests
(`file_sha256`), the one spelling of float32 weights (`normalized_quantization`) and the
decoding defaults an export records (`export_decoding`).

One module per format builds on it: `litmt.deploy.export.ct2`, `.onnx`, `.hf`, `.argos`,
`.web`.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from litmt.decoding.config import DecodeConfig
from litmt.errors import ConfigError, LitmtError


class ExportError(LitmtError, ValueError):
    """A model or option that cannot be exported to CTranslate2."""


# The decoding defaults litmt.json records: these DecodeConfig fields, DecodeConfig's defaults.
DECODING_KEYS = ("beam_size", "length_penalty", "max_len_a", "max_len_b")
DEFAULT_DECODING = {key: getattr(DecodeConfig(), key) for key in DECODING_KEYS}


def export_decoding(decoding: Mapping[str, Any] | None) -> dict[str, Any]:
    """`DEFAULT_DECODING` with the keys `decoding` sets (None = keep), type-checked."""
    config = DecodeConfig.from_options(decoding)  # ConfigError for a mistyped value
    return {key: getattr(config, key) for key in DECODING_KEYS}


def file_sha256(paths: str | Path | Sequence[str | Path]) -> str:
    """sha256 of a file (several files: of their digests, in order)."""
    path_list = [paths] if isinstance(paths, str | Path) else list(paths)
    digests = []
    for p in path_list:
        h = hashlib.sha256()
        with Path(p).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digests.append(h.hexdigest())
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def normalized_quantization(quantization: str | None) -> str:
    """The one spelling of float32 weights on every export: None, "null" and "float32" are
    "none"; any other value is returned as a string (each format checks its own list)."""
    return "none" if quantization in (None, "null", "float32") else str(quantization)


def checked_quantization(quantization: str | None, allowed: Sequence[str], fmt: str) -> str:
    """`quantization` in its one spelling (`normalized_quantization`) if format `fmt` offers it.

    Raises:
        ConfigError: one line naming the format and the quantizations it offers.
    """
    q = normalized_quantization(quantization)
    if q not in allowed:
        raise ConfigError(
            f"format={fmt} supports quantization {' | '.join(allowed)}, not '{quantization}'"
        )
    return q


def check_replaceable(out: Path, force: bool, is_ours: Callable[[Path], bool]) -> None:
    """Refuse (`ConfigError`) to write `out` when it exists, unless `force` and it is an
    export of this kind (`is_ours`) or an empty directory: force never deletes other data."""
    if not out.exists():
        return
    if not force:
        raise ConfigError(f"export directory {out} already exists; pass force=true to replace it")
    if not is_ours(out) and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"{out} exists and is not a litmt export; force=true only replaces exports"
        )


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """A fresh directory next to `out` to write an export into; when the block succeeds it
    replaces `out` (rename), when it fails it is removed: never a half-written `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


__all__ = [
    "DECODING_KEYS",
    "DEFAULT_DECODING",
    "ExportError",
    "check_replaceable",
    "checked_quantization",
    "export_decoding",
    "file_sha256",
    "normalized_quantization",
    "staged_directory",
]
