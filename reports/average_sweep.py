"""Which checkpoints to average: valid BLEU of several choices, from one run's checkpoints.

Run a training with every epoch's checkpoint kept
(``callbacks.model_checkpoint.save_top_k=-1``), then::

    python -m reports.average_sweep RUN_DIR [RUN_DIR ...] [--valid-src F --valid-ref F]

For each run it averages (`litmt.checkpoint.average.average_checkpoints`) and decodes the
valid split greedily, scored with sacreBLEU as the end step scores it
(`litmt.training.finalize.bleu_on_split`):

- ``best``: the checkpoint with the highest validation BLEU (its file name), alone;
- ``top-k``: the k checkpoints with the highest validation BLEU (what `finalize.average_best`
  does);
- ``last-k``: the last k epochs;
- ``last-k/s``: k checkpoints spaced s epochs apart, ending at the last epoch.

Only valid is decoded: the choice of strategy must never see test. Prints one markdown table
per run. The checkpoint names are Lightning's ``...step{N}...-bleu{B}.ckpt`` (the
`callbacks.model_checkpoint.filename` default of litmt).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from benchmarks.common import MULTI30K
from litmt.checkpoint.average import average_checkpoints
from litmt.data.text import read_text_file
from litmt.decoding.translator import Translator
from litmt.errors import LitmtError
from litmt.training.finalize import GREEDY, Split, bleu_on_split

NAME = re.compile(r"step(\d+).*?bleu(\d+(?:\.\d+)?)\.ckpt$")


def run_checkpoints(run_dir: Path) -> list[tuple[int, float, Path]]:
    """(step, valid BLEU, path) of every per-epoch checkpoint of `run_dir`, by step."""
    found = []
    for path in (run_dir / "checkpoints").glob("*.ckpt"):
        m = NAME.search(path.name)
        if m and not path.name.startswith("avg"):
            found.append((int(m.group(1)), float(m.group(2)), path))
    if len(found) < 2:
        raise LitmtError(
            f"{run_dir}/checkpoints has {len(found)} per-epoch checkpoint(s); train with "
            "callbacks.model_checkpoint.save_top_k=-1 to keep every epoch"
        )
    return sorted(found)


def strategies(ckpts: list[tuple[int, float, Path]]) -> dict[str, list[tuple[int, float, Path]]]:
    """The averaging choices compared, each a list of checkpoints (see the module docstring)."""
    ranked = sorted(ckpts, key=lambda c: c[1], reverse=True)  # by valid BLEU, best first
    out: dict[str, list[tuple[int, float, Path]]] = {"best": ranked[:1]}
    for k in (2, 3, 5, 8):
        if k <= len(ckpts):
            out[f"top-{k}"] = ranked[:k]
    for k in (2, 3, 5, 8):
        if k <= len(ckpts):
            out[f"last-{k}"] = ckpts[-k:]
    for k, s in ((5, 2), (4, 3)):
        if (k - 1) * s < len(ckpts):
            out[f"last-{k}/{s}"] = ckpts[::-1][::s][:k][::-1]
    return out


def main() -> None:
    """Parse the arguments, sweep every run, print the tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (with checkpoints/)")
    p.add_argument("--valid-src", type=Path, default=MULTI30K / "valid.en")
    p.add_argument("--valid-ref", type=Path, default=MULTI30K / "valid.de")
    p.add_argument("--max-tokens", type=int, default=4096)
    args = p.parse_args()
    valid = Split(
        "valid",
        read_text_file(args.valid_src, "valid source"),
        read_text_file(args.valid_ref, "valid reference"),
    )
    for run in args.runs:
        ckpts = run_checkpoints(run)
        steps = [c[0] for c in ckpts]
        print(f"\n{run}: {len(ckpts)} checkpoints, steps {steps[0]}..{steps[-1]}\n")
        print("| averaged | epochs (1 = first kept) | valid BLEU (greedy) | chrF | s |")
        print("|---|---|---:|---:|---:|")
        with tempfile.TemporaryDirectory() as tmp:
            for name, chosen in strategies(ckpts).items():
                t0 = time.perf_counter()
                paths = [c[2] for c in chosen]
                ckpt = paths[0]
                if len(paths) > 1:
                    ckpt = average_checkpoints(paths, Path(tmp) / f"{name.replace('/', '_')}.ckpt")
                translator = Translator.from_checkpoint(str(ckpt))
                s = bleu_on_split(translator, valid, GREEDY, args.max_tokens)
                epochs = ",".join(str(steps.index(c[0]) + 1) for c in chosen)
                print(
                    f"| {name} | {epochs} | {s['bleu']:.2f} | {s['chrf']:.2f} "
                    f"| {time.perf_counter() - t0:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
