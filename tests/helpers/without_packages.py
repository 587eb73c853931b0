"""Run a script or module as if hydra, omegaconf, datasets and wandb were not installed.

    python3 tests/helpers/without_packages.py -m pytest -m gpu --collect-only -q
    python3 tests/helpers/without_packages.py scripts/gpu_check.py --help

The GPU image lacks these four packages (docs/guide/scale.md#gpu-check). A `sys.meta_path`
finder placed first raises `ModuleNotFoundError` for each of them, as a missing package does
(`importlib.util.find_spec` included, which Lightning calls for omegaconf); then the script
or module runs with `runpy`, in this process only. Under `-m pytest`, hydra's own pytest
plugin (an entry point of hydra-core, absent where hydra-core is) is disabled too.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys
from collections.abc import Sequence
from typing import Any

BLOCKED = frozenset({"hydra", "omegaconf", "datasets", "wandb"})
# pytest plugins that the blocked packages register (entry points), by plugin name
PLUGINS = ("hydra_pytest",)


class Blocker(importlib.abc.MetaPathFinder):
    """Finds nothing for the `BLOCKED` top-level packages: they are not installed."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: Any = None) -> None:
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


def main(argv: list[str]) -> None:
    for name in list(sys.modules):  # nothing imported before the hook may leak through
        if name.partition(".")[0] in BLOCKED:
            del sys.modules[name]
    sys.meta_path.insert(0, Blocker())
    if argv[:1] == ["-m"]:
        extra = [f"-p no:{p}" for p in PLUGINS] if argv[1] == "pytest" else []
        sys.argv = [argv[1], *extra, *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python3 SCRIPT` does
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
