"""The checkpoints a job names: one path, a list, or the last N of a run directory."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from litmt.errors import ConfigError

# -- which checkpoints, on which device -----------------------------------------------------
_STEP = re.compile(r"step=?(\d+)")  # Lightning's step=N and litmt's best-stepNNNNNN


def select_last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The `n` most recent checkpoints under `run_dir` (searched recursively), oldest first.

    ``last*.ckpt`` (a copy of the newest) and ``avg*``/``average*`` files (earlier averages)
    are skipped. "Recent" is the training step in the file name when every file has one
    (Lightning's default ``epoch=E-step=N.ckpt``, litmt's ``best-stepNNNNNN-bleuB.ckpt``),
    else the modification time.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ConfigError(f"run_dir={root} is not a directory")
    if n < 1:
        raise ConfigError(f"average_last must be at least 1, got {n}")
    files = [
        p
        for p in root.rglob("*.ckpt")
        if not p.name.startswith(("last", "avg", "average")) and p.is_file()
    ]
    if len(files) < n:
        raise ConfigError(
            f"average_last={n} but {root} holds {len(files)} checkpoint(s) "
            "(excluding last*.ckpt and avg*.ckpt)"
        )
    steps = [_STEP.search(p.name) for p in files]
    if all(steps):
        files = [p for _, p in sorted(zip((int(m[1]) for m in steps), files, strict=True))]
    else:
        files.sort(key=lambda p: (p.stat().st_mtime, p.name))
    return files[-n:]


def checkpoint_paths(
    ckpt_path: str | Path | Sequence[str | Path] | None,
    *,
    run_dir: str | Path | None = None,
    average_last: int | None = None,
) -> list[str]:
    """The checkpoints a job names: ``ckpt_path`` (one path or a list, e.g. an OmegaConf
    ListConfig) or ``run_dir`` + ``average_last`` (see `select_last_checkpoints`).

    The one parser of checkpoint arguments behind translate, evaluate, visualize and
    checkpoint averaging. Several paths mean: average their weights (`load_model`).

    Raises:
        ConfigError: nothing given, both forms given, or ``average_last`` without ``run_dir``.
    """
    if ckpt_path and average_last:
        raise ConfigError("give either ckpt_path=... or run_dir=DIR average_last=N, not both")
    if average_last:
        if not run_dir:
            raise ConfigError("average_last=N needs run_dir=<the run's directory>")
        return [str(p) for p in select_last_checkpoints(run_dir, int(average_last))]
    if not ckpt_path:
        raise ConfigError(
            "no checkpoint given: pass ckpt_path=<.ckpt> (or a list), or run_dir=DIR average_last=N"
        )
    if isinstance(ckpt_path, str | Path):
        return [str(ckpt_path)]
    return [str(p) for p in ckpt_path]
