"""`TokenizerConfig`: how sentencepiece is trained (`data.tokenizer`), defined once.

Each field's docstring is its one documentation (`conf/data/base.yaml` shows it,
`tests/unit/test_config_defaults.py` checks it); `litmt.data.tokenization.tokenizer` trains and loads the
models these settings describe.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from litmt.data.tokenization.segmentation import SubwordSampling
from litmt.errors import ConfigError


@dataclass
class TokenizerConfig:
    """How to train sentencepiece (`data.tokenizer`; each field's docstring is its one
    documentation, shown in `conf/data/base.yaml`). The sampling fields (subword
    regularisation of the training split, `SubwordSampling`) are not in `key()`."""

    vocab_size: int = 8000
    """pieces (joint: shared by both languages)"""
    model_type: str = "unigram"
    """unigram | bpe"""
    character_coverage: float = 1.0
    """1.0 for Latin scripts, ~0.9995 for CJK"""
    joint: bool = True
    """one vocabulary for both sides (needed for shared embeddings)"""
    input_sentence_size: int = 300_000
    """train on at most this many sentences, a seeded random sample streamed from disk;
    0 = every sentence, as in sentencepiece. sentencepiece holds the sample in memory: about
    0.6 GB + 3.4 GB per million sentences at preparation's peak (docs/results.md#preparation_memory)"""
    seed: int = 0
    """seed of that sample; null in conf/data = data.seed (this default is for a
    TokenizerConfig built alone)"""
    user_defined_symbols: list[str] = field(default_factory=list)
    """pieces never split, e.g. ["<BT>"] (the tags of extra_train and the language tags of
    directions are added)"""
    model: str | None = None
    """an existing sentencepiece .model file (or a directory with src.model) instead of
    training one"""
    sampling_alpha: float | None = None
    """subword regularisation, train split only (re-encoded every epoch; valid/test/decoding
    keep the best segmentation): unigram smoothing | bpe merge-dropout probability, in (0, 1];
    null or 0 = off. Batches are planned on the stored lengths x the measured sampled/stored
    ratio and a sampled side longer than its planned length is drawn again (else keeps its best
    segmentation), so no batch exceeds max_tokens
    (docs/guide/train.md#subword-regularisation)"""
    sampling_nbest: int = -1
    """unigram: sample among the n best segmentations (-1 = all, 1 = the best only: no
    sampling); bpe: keep -1. n > 1 draws with litmt's seeded sampler (the same segmentations
    in every process: reruns, resumes, DDP ranks); -1 and bpe use sentencepiece's generator
    (reproducible within one process only)"""

    def __post_init__(self) -> None:
        a, n = self.sampling_alpha, self.sampling_nbest
        number = isinstance(a, int | float) and not isinstance(a, bool)
        if a is not None and not (number and (a == 0 or 0 < a <= 1)):
            raise ConfigError(
                f"data.tokenizer.sampling_alpha={a!r} is out of range; use a number in (0, 1] "
                f"(unigram: smoothing, bpe: dropout probability), or null or 0 for no sampling"
            )
        if isinstance(n, bool) or not isinstance(n, int) or not (n == -1 or n >= 1):
            raise ConfigError(
                f"data.tokenizer.sampling_nbest={n!r} is out of range; use -1 (sample among "
                f"all segmentations) or an integer >= 1 (among the n best; 1 = the best only)"
            )

    def sampling(self) -> SubwordSampling | None:
        """The subword sampling of the training split, or None when it is off."""
        if not self.sampling_alpha:
            return None
        return SubwordSampling(float(self.sampling_alpha), int(self.sampling_nbest))

    def key(self) -> str:
        """A short string identifying these settings, used in cache paths."""
        kind = "joint" if self.joint else "sep"
        key = f"{self.model_type}{self.vocab_size}-{kind}-cc{self.character_coverage}-n{self.input_sentence_size}"
        if self.user_defined_symbols:  # only then, so that older cache paths stay valid
            key += (
                "-u" + hashlib.sha256("\n".join(self.user_defined_symbols).encode()).hexdigest()[:8]
            )
        return key


__all__ = ["TokenizerConfig"]
