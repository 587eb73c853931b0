"""Prepare the data in one process per node (or per job) while the other processes wait.

Launchers such as torchrun or SLURM start every rank at once, before any process group
exists. The preparing process (`is_preparer`: Lightning's rule) runs the preparation and then
writes a JSON marker file (``{"status": "ok" | "failed", "paths": [...]}``) atomically; the
others poll it (`wait_for_marker`). A process started after the preparer finished (the ranks
Lightning's own launcher starts inside `fit`) finds the marker at once.
`litmt.data.datamodule.TranslationDataModule.prepare_once` is the caller.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from litmt.errors import DataError

log = logging.getLogger(__name__)


def launch_ranks() -> tuple[int, int]:
    """(local rank, node rank) of this process, from its launcher's environment.

    The variables Lightning's cluster environments read (lightning/fabric/plugins/
    environments): `LightningEnvironment` and torchrun's `TorchElasticEnvironment` LOCAL_RANK
    and NODE_RANK / GROUP_RANK; `SLURMEnvironment` SLURM_LOCALID and SLURM_NODEID. Lightning's
    own launcher sets LOCAL_RANK in the processes it starts. A plain run is (0, 0).
    """
    env = os.environ
    local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    node = env.get("NODE_RANK", env.get("GROUP_RANK", env.get("SLURM_NODEID", "0")))
    return int(local), int(node)


def is_preparer(per_node: bool) -> bool:
    """Whether this process prepares the data (Lightning's rule, `_DataConnector.prepare_data`:
    local rank 0 when `per_node` (`prepare_data_per_node`), else global rank 0)."""
    local, node = launch_ranks()
    return local == 0 and (per_node or node == 0)


def prepare_and_publish(prepare: Callable[[], list[str]], marker: Path) -> None:
    """Run `prepare` (it returns the paths it published), then write `marker`: ``ok`` with
    those paths, or ``failed`` when `prepare` raised (re-raised), so that the waiters stop."""
    marker.unlink(missing_ok=True)
    paths: list[str] | None = None
    try:
        paths = prepare()
    finally:  # on failure too, so that the waiting ranks stop and report it
        marker.parent.mkdir(parents=True, exist_ok=True)
        state = {"status": "failed" if paths is None else "ok", "paths": paths or []}
        tmp = marker.with_name(marker.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(state))
        tmp.replace(marker)  # atomic publish


def _read_marker(path: Path) -> tuple[dict[str, Any], float] | None:
    """The preparer's marker and its mtime, or None while it is absent (or being replaced)."""
    try:
        return json.loads(path.read_text()), path.stat().st_mtime
    except (OSError, ValueError):
        return None


def wait_for_marker(marker: Path, *, per_node: bool, timeout: float, poll_s: float) -> None:
    """Poll `marker` until the preparer says ``ok`` and every path it lists exists.

    Raises:
        DataError: the preparer failed (a marker written by this job), or `timeout` passed.
    """
    who = "local rank 0 of this node" if per_node else "global rank 0"
    started = time.time()
    deadline = time.monotonic() + timeout
    log.info("data: waiting for %s to prepare the tokenizer and caches (%s)", who, marker)
    next_note = time.monotonic() + 60
    while True:
        found = _read_marker(marker)
        if found is not None:
            state, mtime = found
            if state.get("status") == "ok" and all(Path(p).exists() for p in state["paths"]):
                log.info("data: prepared by %s after %.0fs", who, time.time() - started)
                return
            # a failed marker counts only when written by this job (not by an earlier run)
            if state.get("status") == "failed" and mtime >= started - 1:
                raise DataError(f"data preparation failed in {who}; see that process's log")
        if time.monotonic() > deadline:
            raise DataError(
                f"waited {timeout:.0f}s for {who} to prepare the data ({marker}); "
                "raise data.prepare_timeout, or set data.prepare_data_per_node=false only when "
                "every node shares data.cache_dir"
            )
        if time.monotonic() > next_note:  # a sign of life during a long preparation
            log.info("data: still waiting for %s (%.0fs)", who, time.time() - started)
            next_note += 60
        time.sleep(poll_s)
