"""Several translation directions in one model (`data.directions`, e.g. ``[en-de, en-fr]``).

Every direction is a `ParallelCorpus` over the same files (``{dir}/{split}.{src}`` and
``{split}.{tgt}``); the splits are their concatenation in config order, each example tagged
with its target language's token ``<2xx>`` (a sentencepiece user-defined symbol, so one
piece). Where the tag goes is `data.tag_placement`:

- ``source``: prepended to the source sentence (``"<2fr> A dog runs."``), as in Johnson et
  al. (2017) and OPUS-MT's ``>>fr<<``; every engine (torch, CTranslate2, an Argos package)
  carries it as plain source text.
- ``target``: the first target token (``<2fr> Un chien court.``), as in fairseq's
  ``--decoder-langtok``; decoding forces it as a one-token target prefix
  (`litmt.decoding.steering`, CTranslate2's ``target_prefix``) and drops it from the text.

Temperature sampling (`data.sampling_temperature` T): direction i, with n_i training pairs,
gets a share p_i = n_i^(1/T) / sum_j n_j^(1/T) of the N = sum_j n_j training examples of the
epoch: T=1 keeps the corpus proportions, larger T flattens them, T=inf is uniform. The
examples of direction i are its pairs repeated whole as often as round(N p_i) allows, plus a
subset of r_i pairs for the rest (`sampled_positions`), drawn again every epoch as a pure
function of (data.seed, epoch), so a resumed run and every DDP rank draw the same. The
subsets walk through a seeded permutation of the direction's pairs, r_i at a time
(`epoch_subset`), so every pair of a downsampled direction is seen within ceil(n_i / r_i)
epochs, and no pair twice in one epoch's subset.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from litmt.config import check_keys
from litmt.errors import ConfigError

PLACEMENTS = ("source", "target")
_LANG = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_TAG = re.compile(r"^<2([A-Za-z][A-Za-z0-9_]*)>$")


def lang_tag(lang: str) -> str:
    """The target-language token of `lang`: ``<2de>``."""
    return f"<2{lang}>"


def tag_language(piece: str) -> str | None:
    """The language of a target-language token (``<2de>`` -> ``de``), None for other pieces."""
    m = _TAG.match(piece)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Direction:
    """One translation direction of a multilingual model."""

    src: str  # source language code (file suffix)
    tgt: str  # target language code
    dir: str | None = None  # its own corpus folder (None = data.dir)
    splits: tuple[tuple[str, Any], ...] = ()  # its own split stems, e.g. (("train", "bt"),)

    @property
    def name(self) -> str:
        """``en-de``: the key in configs, metric names (``valid/bleu_en-de``) and checkpoints."""
        return f"{self.src}-{self.tgt}"

    @property
    def tag(self) -> str:
        """The target-language token, ``<2de>``."""
        return lang_tag(self.tgt)


DIRECTION_KEYS = ("pair", "dir", "splits")


def parse_direction(value: Any) -> Direction:
    """``"en-de"`` (or ``"en_de"``, ``["en", "de"]``, or a mapping ``{pair: en-de, dir:
    PATH, splits: {train: STEM}}`` for a direction with its own corpus) as a `Direction`.

    Raises:
        ConfigError: not two distinct language codes, or unknown mapping keys.
    """
    if isinstance(value, Mapping):
        check_keys(value, DIRECTION_KEYS, "data.directions entry")
        base = parse_direction(value.get("pair"))
        directory = value.get("dir")
        splits = tuple(sorted((str(k), v) for k, v in dict(value.get("splits") or {}).items()))
        return Direction(base.src, base.tgt, None if directory is None else str(directory), splits)
    if isinstance(value, str):
        parts = re.split(r"[-_>]", value.strip())
    elif isinstance(value, Sequence):
        parts = [str(v) for v in value]
    else:
        parts = []
    if len(parts) != 2 or not all(_LANG.match(p) for p in parts) or parts[0] == parts[1]:
        raise ConfigError(
            f"a direction must be two different language codes like en-de, got {value!r}"
        )
    return Direction(parts[0], parts[1])


def parse_directions(values: Any) -> list[Direction]:
    """`data.directions` as a list of distinct `Direction`s ([] for null or an empty list).

    Raises:
        ConfigError: a malformed or repeated direction.
    """
    if values is None:
        return []
    if isinstance(values, str):
        values = [v for v in values.split(",") if v.strip()]
    out: list[Direction] = []
    for v in values:
        d = parse_direction(v)
        if d.name in [o.name for o in out]:
            raise ConfigError(f"data.directions lists {d.name} twice")
        out.append(d)
    return out


def check_placement(placement: str) -> str:
    """`data.tag_placement` checked.

    Raises:
        ConfigError: not one of `PLACEMENTS`.
    """
    if placement not in PLACEMENTS:
        raise ConfigError(
            f"unknown data.tag_placement {placement!r}; choose one of {', '.join(PLACEMENTS)}"
        )
    return placement


def sampling_weights(sizes: Sequence[int], temperature: float) -> list[float]:
    """Per direction, its share of the training examples: p_i ∝ n_i^(1/T).

    Args:
        sizes: training pairs per direction (n_i).
        temperature: T >= 1 by convention (any T > 0 works); ``inf`` = uniform.

    Raises:
        ConfigError: T <= 0.
    """
    if not temperature > 0:
        raise ConfigError(
            f"data.sampling_temperature must be > 0 (1 = proportional, inf = uniform), "
            f"got {temperature}"
        )
    live = [n for n in sizes if n > 0]
    if not live:
        return [0.0 for _ in sizes]
    if math.isinf(temperature):
        raw = [1.0 if n > 0 else 0.0 for n in sizes]
    else:
        top = max(live)  # scaled: no overflow for large corpora
        raw = [(n / top) ** (1.0 / temperature) if n > 0 else 0.0 for n in sizes]
    total = sum(raw)
    return [r / total for r in raw]


def epoch_subset(n: int, size: int, seed: int, key: int, epoch: int) -> np.ndarray:
    """(size,) distinct positions in range(n) for `epoch`: a window of a seeded permutation.

    Epochs run in cycles of K = ceil(n / size); cycle c = epoch // K shuffles range(n) with
    ``default_rng([seed, key, c, 1])`` and epoch j = epoch % K of it takes the permutation's
    entries j*size ... (j+1)*size - 1, wrapping to its start in the last epoch of the cycle.
    So each cycle of K epochs covers every position, and the draw costs one permutation.

    Args:
        n: positions to draw from (n > 0).
        size: how many to draw (0 <= size <= n).
        seed: the base seed (`data.seed`); key: which stream (the direction number).
        epoch: the epoch (0-based).
    """
    cycle_len = -(-n // size) if size else 1
    cycle, j = divmod(int(epoch), cycle_len)
    perm = np.random.default_rng([int(seed), int(key), cycle, 1]).permutation(n)
    return perm[np.arange(j * size, (j + 1) * size) % n]


def sampled_positions(
    groups: Sequence[np.ndarray], temperature: float, seed: int, epoch: int = 0
) -> tuple[np.ndarray, list[int]]:
    """The training examples of `epoch` under temperature sampling.

    Args:
        groups: per direction, the (n_i,) positions of its examples in the training data.
        temperature: see `sampling_weights`.
        seed: with `epoch`, the draw of the partial repeats (`epoch_subset`).
        epoch: the epoch whose draw this is (the counts are the same for every epoch).

    Returns:
        (N,) positions (N = sum n_i; direction i appears round(N p_i) times: whole repeats
        of `groups[i]`, then the epoch's subset without repeats, sorted), and those counts.
    """
    sizes = [len(g) for g in groups]
    total = sum(sizes)
    weights = sampling_weights(sizes, temperature)
    parts, counts = [], []
    for k, (g, w) in enumerate(zip(groups, weights, strict=True)):
        want = round(total * w) if len(g) else 0
        whole, rest = divmod(want, len(g)) if len(g) else (0, 0)
        chosen = [np.tile(g, whole)] if whole else []
        if rest:
            chosen.append(np.sort(np.asarray(g)[epoch_subset(len(g), rest, seed, k, epoch)]))
        parts.extend(chosen)
        counts.append(want)
    positions = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return positions.astype(np.int64), counts


def direction_of(offsets: Sequence[int], indices: np.ndarray) -> np.ndarray:
    """(N,) direction number of each example index, given the (D+1,) start offsets of the
    directions in the split (direction d holds indices ``offsets[d] <= i < offsets[d+1]``)."""
    return np.searchsorted(np.asarray(offsets[1:]), np.asarray(indices), side="right")


__all__ = [
    "PLACEMENTS",
    "Direction",
    "check_placement",
    "direction_of",
    "epoch_subset",
    "lang_tag",
    "parse_direction",
    "parse_directions",
    "sampled_positions",
    "sampling_weights",
    "tag_language",
]
