"""Token-budget batches of prepared ids, for every engine and for forced decoding.

`token_batches` groups sentences into batches of at most ``max_tokens`` padded tokens
(`Translator.search_ids`, the CTranslate2 engine's check, `ForcedDecoder`, the alignments);
`even_parts` splits one batch into equal parts (the ONNX engine's searches without a beam);
`padded` makes one batch's (B, T) tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from litmt.errors import ConfigError


def check_max_tokens(max_tokens: int) -> None:
    """Refuse a batch budget below one token (every engine's `search_ids`, `token_batches`).

    Raises:
        ConfigError: `max_tokens` < 1.
    """
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be positive, got {max_tokens}")


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group indices into batches of at most `max_tokens` padded source tokens.

    Sentences are sorted longest first (so similar lengths share a batch and an
    out-of-memory shows up at once); a sentence longer than `max_tokens` gets its own batch.

    Returns:
        Lists of indices into `lengths`.
    """
    check_max_tokens(max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def even_parts(batch: Sequence[int], longest: int, max_tokens: int) -> list[list[int]]:
    """`batch` (indices, longest first, its longest `longest` tokens) in the fewest parts of
    equal size (one more sentence in the first parts when they do not divide evenly) whose
    padded source tokens stay at about `max_tokens` or less: ceil(len * longest / max_tokens)
    parts. Unlike filling batches up to the budget, no part is a small remainder that costs a
    step as much as a full one (a step reads all the model's weights whatever its rows).

    Returns:
        Lists of the indices of `batch`, in its order.
    """
    check_max_tokens(max_tokens)
    parts = max(1, min(len(batch), math.ceil(len(batch) * longest / max_tokens)))
    size, extra = divmod(len(batch), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        out.append(list(batch[start:end]))
        start = end
    return out


def padded(rows: Sequence[Sequence[int]], fill: int) -> Tensor:
    """(B, T) long tensor of the rows right-padded with `fill` (T = the longest row)."""
    out = torch.full((len(rows), max(len(r) for r in rows)), fill, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out


__all__ = ["check_max_tokens", "even_parts", "padded", "token_batches"]
