"""Tokenised examples as a torch Dataset, and the collate function that pads them.

Shapes: B sentences in a batch, S longest source, T longest target + 1 (bos/eos), each
rounded up to `pad_to_multiple` when that is set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID

_EMPTY_SRC = np.array([EOS_ID], dtype=np.int64)
Example = tuple[int, np.ndarray, np.ndarray]  # (index in split, source ids, target ids)


class TokenizedPairs(Dataset):
    """Source/target token ids stored flat (values + offsets), cheap to share with workers.

    Args:
        src_values, src_offsets: concatenated source ids and (N+1,) row offsets.
        tgt_values, tgt_offsets: the same for the target (ids without bos/eos).
        indices: (N,) index of each example in its split (differs from the position only
            when training examples were filtered out).
        max_src_len: truncate sources to this many tokens (None = keep).
        max_tgt_len: truncate targets to this many tokens (None = keep).
        src_lens, tgt_lens: (N,) token counts (the offsets' differences), when stored (the
            memory-mapped cache): the sampler then reads them without a copy.
    """

    def __init__(
        self,
        src_values: np.ndarray,
        src_offsets: np.ndarray,
        tgt_values: np.ndarray,
        tgt_offsets: np.ndarray,
        indices: np.ndarray | None = None,
        max_src_len: int | None = None,
        max_tgt_len: int | None = None,
        src_lens: np.ndarray | None = None,
        tgt_lens: np.ndarray | None = None,
    ) -> None:
        # np.asarray: plain ndarray views of memory-mapped arrays (no copy), whose slices
        # skip np.memmap's per-slice Python overhead in `__getitem__`
        self.src_values, self.src_offsets = (
            np.asarray(src_values),
            np.asarray(src_offsets, dtype=np.int64),
        )
        self.tgt_values, self.tgt_offsets = (
            np.asarray(tgt_values),
            np.asarray(tgt_offsets, dtype=np.int64),
        )
        n = len(self.src_offsets) - 1
        self.indices = np.arange(n, dtype=np.int64) if indices is None else np.asarray(indices)
        self.max_src_len, self.max_tgt_len = max_src_len, max_tgt_len
        self._src_lens = None if src_lens is None else np.asarray(src_lens)
        self._tgt_lens = None if tgt_lens is None else np.asarray(tgt_lens)

    @classmethod
    def from_lists(
        cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], **kwargs: object
    ) -> TokenizedPairs:
        """Build from python lists of ids (tests, small data)."""

        def flat(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
            offsets = np.zeros(len(rows) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(r) for r in rows])
            values = np.fromiter((i for r in rows for i in r), dtype=np.int32, count=offsets[-1])
            return values, offsets

        return cls(*flat(src), *flat(tgt), **kwargs)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.indices)

    def _raw_lengths(self, side: str, start: int, stop: int | None) -> np.ndarray:
        """(stop - start,) token counts of positions start:stop of `side` (no copy when stored)."""
        stored = self._src_lens if side == "src" else self._tgt_lens
        if stored is not None:
            return stored[start:stop]
        offsets = self.src_offsets if side == "src" else self.tgt_offsets
        return np.diff(offsets[start : None if stop is None else stop + 1])

    def _raw_lengths_at(self, side: str, positions: np.ndarray) -> np.ndarray:
        """(n,) token counts of `side` at `positions` (any order, repeats allowed)."""
        stored = self._src_lens if side == "src" else self._tgt_lens
        if stored is not None:
            return stored[positions]
        offsets = self.src_offsets if side == "src" else self.tgt_offsets
        return offsets[positions + 1] - offsets[positions]

    def _src_tensor(self, lens: np.ndarray) -> np.ndarray:
        return lens if self.max_src_len is None else np.minimum(lens, self.max_src_len)

    def _tgt_tensor(self, lens: np.ndarray) -> np.ndarray:
        lens = lens if self.max_tgt_len is None else np.minimum(lens, self.max_tgt_len)
        if len(lens) and int(lens.max()) < 2**15 - 1:  # int16: half the memory of a copy
            return np.add(lens, 1, dtype=np.int16)
        return lens + 1

    def src_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(N,) source tensor lengths (after truncation), of positions start:stop."""
        return self._src_tensor(self._raw_lengths("src", start, stop))

    def tgt_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(N,) target tensor lengths: tokens (after truncation) + 1 for bos/eos, of
        positions start:stop."""
        return self._tgt_tensor(self._raw_lengths("tgt", start, stop))

    def src_lengths_at(self, positions: np.ndarray) -> np.ndarray:
        """(n,) source tensor lengths at `positions` (reads only those)."""
        return self._src_tensor(self._raw_lengths_at("src", np.asarray(positions)))

    def tgt_lengths_at(self, positions: np.ndarray) -> np.ndarray:
        """(n,) target tensor lengths (+ 1) at `positions` (reads only those)."""
        return self._tgt_tensor(self._raw_lengths_at("tgt", np.asarray(positions)))

    def __getitem__(self, pos: int) -> Example:
        s = self.src_values[self.src_offsets[pos] : self.src_offsets[pos + 1]]
        t = self.tgt_values[self.tgt_offsets[pos] : self.tgt_offsets[pos + 1]]
        if self.max_src_len is not None:
            s = s[: self.max_src_len]
        if self.max_tgt_len is not None:
            t = t[: self.max_tgt_len]
        return int(self.indices[pos]), s, t


def padded_length(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple` (1 = unchanged)."""
    return -(-int(n) // multiple) * multiple if multiple > 1 else int(n)


def collate(examples: Sequence[Example], pad_to_multiple: int = 1) -> dict[str, Tensor | int]:
    """Pad a list of examples into a batch.

    Args:
        examples: (index, source ids, target ids) triples.
        pad_to_multiple: pad S and T up to a multiple of this (extra columns are PAD and
            masked). FP8 GEMMs need the rows B*S and B*T of every projection to be divisible
            by 8 (Transformer Engine, transformer_engine/pytorch/utils.py
            `assert_dim_for_fp8_exec`); padding the lengths guarantees it for any B.

    Returns:
        dict with
        - `src` (B, S) long, right-padded with PAD=0 (no bos/eos; an empty source is [eos]);
        - `tgt_in` (B, T) long = bos + y, right-padded; `tgt_out` (B, T) long = y + eos;
        - `src_padding_mask` (B, S) / `tgt_padding_mask` (B, T) bool, True = padding;
        - `src_lengths`, `tgt_lengths` (B,) long (target length counts the bos/eos);
        - `index` (B,) long, each example's index in its split;
        - `ntokens` python int, the number of non-pad target tokens (= tgt_lengths.sum()).
    """
    b = len(examples)
    # an empty source (possible in valid/test, never filtered) becomes one eos so that no
    # row of the encoder's key padding mask is all padding
    examples = [(i, s if len(s) else _EMPTY_SRC, t) for i, s, t in examples]
    src_len = np.array([len(e[1]) for e in examples], dtype=np.int64)
    tgt_len = np.array([len(e[2]) + 1 for e in examples], dtype=np.int64)
    if pad_to_multiple < 1:
        raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
    s_max = padded_length(src_len.max(), pad_to_multiple)
    t_max = padded_length(tgt_len.max(), pad_to_multiple)
    src = np.full((b, s_max), PAD_ID, dtype=np.int64)  # (B, S)
    tgt_in = np.full((b, t_max), PAD_ID, dtype=np.int64)  # (B, T)
    tgt_out = np.full_like(tgt_in, PAD_ID)  # (B, T)
    for i, (_, s, t) in enumerate(examples):
        n = len(t)
        src[i, : len(s)] = s
        tgt_in[i, 0] = BOS_ID
        tgt_in[i, 1 : n + 1] = t
        tgt_out[i, :n] = t
        tgt_out[i, n] = EOS_ID
    src_t, tgt_in_t, tgt_out_t = map(torch.from_numpy, (src, tgt_in, tgt_out))
    return {
        "src": src_t,
        "tgt_in": tgt_in_t,
        "tgt_out": tgt_out_t,
        "src_padding_mask": src_t.eq(PAD_ID),
        "tgt_padding_mask": tgt_out_t.eq(PAD_ID),
        "src_lengths": torch.from_numpy(src_len),
        "tgt_lengths": torch.from_numpy(tgt_len),
        "index": torch.tensor([e[0] for e in examples], dtype=torch.long),
        "ntokens": int(tgt_len.sum()),
    }
