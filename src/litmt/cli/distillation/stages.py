"""The stages of the student pipeline (`litmt.cli.distillation.student`): their markers, the scripts they
run, and the digests that say whether a stage's inputs changed.

A stage is one or more subprocesses of the real scripts (``scripts/train.py``,
``scripts/distill.py``, ``scripts/export.py``), run with the overrides a user would type.
Its marker ``{out}/.stages/{name}.json`` holds ``state`` (``running`` while the stage runs,
``done`` after), ``settings`` (what decides its outputs: the experiment, the overrides and
the digests of its inputs) and, when done, ``outputs`` (the paths the next stages read).

A rerun reads each marker (`StageMarker.state`): ``done`` with the same settings is skipped,
``running`` (interrupted) runs again (training resumes from its ``last.ckpt``, distillation
after its last chunk), no marker runs, other settings are refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litmt.checkpoint.io import weights_digest
from litmt.decoding.distill import write_json
from litmt.deploy.export.base import file_sha256
from litmt.deploy.export.ct2 import is_export_dir
from litmt.errors import ConfigError, LitmtError

log = logging.getLogger(__name__)

STAGES_DIR = ".stages"
SKIP, RUN, RESUME = "skip", "run", "resume"


def _differs(old: dict[str, Any], new: dict[str, Any]) -> str:
    return ", ".join(sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)))


@dataclass
class StageMarker:
    """One stage's marker file (module docstring)."""

    out: Path
    name: str
    settings: dict[str, Any]

    def __post_init__(self) -> None:
        self.settings = json.loads(json.dumps(self.settings))  # as it reads back from disk

    @property
    def path(self) -> Path:
        return self.out / STAGES_DIR / f"{self.name}.json"

    def _read(self) -> dict[str, Any] | None:
        return json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else None

    def state(self) -> str:
        """`SKIP` (done with these settings), `RESUME` (interrupted) or `RUN` (no marker).

        Raises:
            ConfigError: the marker holds other settings.
        """
        marker = self._read()
        if marker is None:
            return RUN
        if marker["settings"] != self.settings:
            raise ConfigError(
                f"{self.out} holds a {self.name} stage run with other settings (differs in: "
                f"{_differs(marker['settings'], self.settings)}); rerun with those settings, "
                "or choose another out= directory"
            )
        return SKIP if marker["state"] == "done" else RESUME

    def start(self) -> None:
        """Mark the stage as running (an interruption from here on is resumed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {"stage": self.name, "state": "running", "settings": self.settings})

    def finish(self, outputs: dict[str, Any]) -> None:
        """Mark the stage as done, with the outputs the next stages read."""
        marker = {"stage": self.name, "state": "done", "settings": self.settings}
        write_json(self.path, {**marker, "outputs": outputs})

    def outputs(self) -> dict[str, Any]:
        """The outputs a done marker recorded."""
        marker = self._read()
        assert marker is not None and marker["state"] == "done"
        return dict(marker["outputs"])


def data_digest(directory: Path, langs: tuple[str, str]) -> str:
    """A digest of the corpus files ``{directory}/*.{lang}``: names, sizes and modification
    times (as `litmt.data.corpora.parallel.ParallelCorpus.fingerprint`, without reading them)."""
    digest = hashlib.sha256()
    for lang in langs:
        for path in sorted(directory.glob(f"*.{lang}")):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def model_digest(path: str | Path) -> str:
    """The weights digest of a ``.ckpt`` (`weights_digest`), or of an export directory (the
    sha256 of its ``model.bin``).

    Raises:
        CheckpointError: a missing or unreadable checkpoint.
    """
    if is_export_dir(path):
        return "model.bin:" + file_sha256(Path(path) / "model.bin")
    return "weights:" + weights_digest(path)


def quoted(value: str | Path) -> str:
    """`value` as a quoted Hydra override value (paths with spaces, ``=``, brackets)."""
    return "'" + str(value).replace("'", "\\'") + "'"


def run_script(script: Path, overrides: list[str], stage: str) -> None:
    """Run ``python {script} {overrides}`` with this terminal (its progress bars show).

    Raises:
        LitmtError: the script failed (its own error line is printed above).
    """
    log.info("%s: python %s %s", stage, script.name, " ".join(overrides))
    proc = subprocess.run([sys.executable, str(script), *overrides], check=False)
    if proc.returncode != 0:
        raise LitmtError(
            f"the {stage} stage failed (python {script.name} exited with {proc.returncode}, "
            "its output is above); fix it and rerun the same command to resume the stage"
        )


__all__ = [
    "RESUME",
    "RUN",
    "SKIP",
    "STAGES_DIR",
    "StageMarker",
    "data_digest",
    "model_digest",
    "quoted",
    "run_script",
]
