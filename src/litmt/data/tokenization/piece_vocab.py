"""A piece vocabulary over sentencepiece models: ids come from a piece list, not from the
sentencepiece ids (MarianTokenizer's ``vocab.json``; see `litmt.checkpoint.hf_import`).

The source and target sentencepiece models split text into pieces; `PieceVocab` maps each
piece to its id (a piece not in the list is ``<unk>``) and back. Its first four pieces are
litmt's special tokens at litmt's ids: ``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3.
"""

from __future__ import annotations

from collections.abc import Sequence

import sentencepiece as spm

from litmt.data.tokenization.segmentation import SubwordSampling, encode_texts
from litmt.errors import DataError

SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")  # at ids 0, 1, 2, 3


class PieceVocab:
    """Ids of pieces by a list (id -> piece).

    Args:
        pieces: every piece, by id; ``pieces[:4]`` must be `SPECIAL_PIECES`, no duplicates.

    Raises:
        DataError: a wrong special piece or a duplicate.
    """

    def __init__(self, pieces: Sequence[str]) -> None:
        self.pieces = [str(p) for p in pieces]
        if tuple(self.pieces[:4]) != SPECIAL_PIECES:
            raise DataError(
                f"piece vocabulary must start with {', '.join(SPECIAL_PIECES)}, "
                f"got {', '.join(self.pieces[:4])}"
            )
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        if len(self.ids) != len(self.pieces):
            dup = next(p for i, p in enumerate(self.pieces) if self.ids[p] != i)
            raise DataError(f"piece vocabulary has the piece {dup!r} twice")

    def __len__(self) -> int:
        return len(self.pieces)

    def encode(
        self,
        proc: spm.SentencePieceProcessor,
        texts: Sequence[str],
        sampling: SubwordSampling | None = None,
    ) -> list[list[int]]:
        """Ids of `texts` split by `proc` (unknown pieces: ``<unk>``); a leading language code
        ``>>xx<<`` (multilingual OPUS-MT targets) is one piece, as MarianTokenizer reads it.

        Args:
            sampling: a sampled segmentation (`litmt.data.tokenization.segmentation`); None = the best
                one.
        """
        heads: list[list[str]] = []
        rest: list[str] = []
        for text in texts:
            head: list[str] = []
            if text.startswith(">>") and (end := text.find("<<")) != -1:
                head, text = [text[: end + 2]], text[end + 2 :]
            heads.append(head)
            rest.append(text)
        split = encode_texts(proc, rest, sampling, out_type=str)
        return [
            [self.ids.get(p, 1) for p in head + pieces]
            for head, pieces in zip(heads, split, strict=True)
        ]

    def decode(self, proc: spm.SentencePieceProcessor, ids: Sequence[Sequence[int]]) -> list[str]:
        """Text of each id sequence, as MarianTokenizer's ``decode(skip_special_tokens=True)``:
        special ids (``<unk>`` too) dropped, the pieces joined by `proc`, a ``▁`` that `proc`
        does not know (a piece of the other language) read as a space, the ends stripped."""
        out = []
        for seq in ids:
            pieces = [self.pieces[int(i)] for i in seq if int(i) >= len(SPECIAL_PIECES)]
            out.append(proc.decode_pieces(pieces).replace("\u2581", " ").strip())
        return out
