"""The tokenizer cache: load the sentencepiece model(s) of a directory, or publish them there.

A directory under ``<cache_dir>/tokenizers/`` holds one tokenizer, keyed by corpus, direction
and settings (`litmt.data.datamodule.TranslationDataModule.tokenizer_dir`). It is written once,
atomically (a temporary directory, then a rename), so concurrent processes (DDP ranks) agree on
one vocabulary: a process that loses the race uses the published one.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from litmt.data.tokenization.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def publish(tokenizer: Tokenizer, directory: Path) -> None:
    """Save `tokenizer` to `directory` atomically (a temporary directory, then a rename)."""
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    tokenizer.save(tmp)
    try:
        tmp.rename(directory)  # atomic publish
    except OSError:  # another process (e.g. another DDP rank) published first: use theirs
        shutil.rmtree(tmp, ignore_errors=True)


def cached_tokenizer(
    directory: Path,
    *,
    train: Callable[[], Tokenizer],
    given: Tokenizer | None = None,
    given_origin: str | None = None,
    timings: dict[str, float] | None = None,
) -> Tokenizer:
    """The tokenizer of `directory`: loaded when present, else `given` (published there), else
    `train()` (sentencepiece on a bounded sample of the corpus) and published.

    Args:
        timings: receives ``tokenizer_train_s`` when a tokenizer is trained.
    """
    if (directory / "src.model").exists():
        log.info("tokenizer: loaded %s", directory)
        return Tokenizer.load(directory)
    if given is not None:  # published like a trained one (DDP ranks wait)
        publish(given, directory)
        log.info("tokenizer: reusing the one from %s, not training one (data.tokenizer "
                 "training settings ignored) → %s", given_origin, directory)  # fmt: skip
        return Tokenizer.load(directory)
    log.info("tokenizer: training sentencepiece on the training split (%s) ...", directory.name)
    t0 = time.perf_counter()
    tok = train()
    seconds = time.perf_counter() - t0
    if timings is not None:
        timings["tokenizer_train_s"] = seconds
    publish(tok, directory)
    log.info(
        "tokenizer: trained in %.1fs → %s (vocab %d/%d)",
        seconds, directory, tok.src_vocab_size, tok.tgt_vocab_size,
    )  # fmt: skip
    # every process uses the published model, so concurrent trainers agree on one vocabulary
    return Tokenizer.load(directory)
