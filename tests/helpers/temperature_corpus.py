"""A 3-direction corpus with one large direction (en-de) and two small ones (en-fr, en-cs in
their own folder), for temperature sampling: at T=5 en-de is downsampled every epoch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tiny_corpora import write_multi

BIG, SMALL = 400, 40  # training pairs of en-de, and of en-fr and en-cs each


def temperature_kwargs(root: Path, dm_kwargs: dict[str, Any], temperature: float = 5.0) -> dict:
    """`dm_kwargs` over the corpus written under `root`: en-de's pairs are example indices
    0 ... BIG - 1 of the training split, every pair kept by the filter."""
    big = write_multi(root / "big", {"train": BIG, "valid": 10, "test": 10})
    small = write_multi(root / "small", {"train": SMALL, "valid": 10, "test": 10})
    for split in ("train", "valid", "test"):  # cs: the fr sentences, each word + "y"
        fr = (small / f"{split}.fr").read_text(encoding="utf-8").splitlines()
        cs = [" ".join(w + "y" for w in line.split()) for line in fr]
        (small / f"{split}.cs").write_text("\n".join(cs) + "\n", encoding="utf-8")
    return {
        **dm_kwargs,
        "dir": str(big),
        "directions": [
            "en-de",
            {"pair": "en-fr", "dir": str(small)},
            {"pair": "en-cs", "dir": str(small)},
        ],
        "sampling_temperature": temperature,
        "filter": {"max_ratio": math.inf},
    }
