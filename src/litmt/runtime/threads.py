"""CPU threads: the one owner of litmt's thread settings.

``threads=N`` means the same in every command (translate, evaluate, serve) and in
`litmt.load_translator`: N CPU threads for decoding, whatever the engine.

- torch: N intra-op threads for the process (``torch.set_num_threads(N)``). The torch engine
  decodes with them; on engine=ct2 they serve the attention explorer's torch model.
- CTranslate2 (engine=ct2): on the CPU, N batches decoded at once with one thread each
  (``inter_threads=N, intra_threads=1``, `ct2_thread_options`); on a GPU, ``intra_threads=N``.

``threads=0`` (the default) means torch's own count (the physical cores, or what
``OMP_NUM_THREADS`` says) for torch, and the same count for CTranslate2 on the CPU. It is not
CTranslate2's default there: that is ``intra_threads=4`` whatever the machine (CTranslate2's
documentation, parallel.md), and on 2 cores its OpenMP threads contend: the recipe teacher distilled
Multi30k at 76 sentences/s against 399 with 2 workers (int8, beam 5, 1000 lines).

Training a sentencepiece tokenizer does not follow ``threads``: its thread count is part of the
result (a unigram vocabulary's pieces differ between 1, 2 and 4 threads on the same text), so
it is pinned to `TOKENIZER_TRAIN_THREADS` and a run trains the same tokenizer on any machine.
"""

from __future__ import annotations

import os

from litmt.errors import ConfigError

# sentencepiece training threads: fixed, because they change a unigram model's pieces
TOKENIZER_TRAIN_THREADS = 2


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_threads(threads: int) -> int:
    """`threads` as an int, refused when negative (0 = the libraries' defaults).

    Raises:
        ConfigError: a negative count.
    """
    threads = int(threads)
    if threads < 0:
        raise ConfigError(f"threads must be >= 0 (0 = the default), got {threads}")
    return threads


def use_threads(threads: int) -> None:
    """Give torch `threads` intra-op threads for this process (0: leave torch's setting)."""
    if check_threads(threads) > 0:
        import torch

        torch.set_num_threads(threads)


def ct2_thread_options(device_kind: str, threads: int) -> dict[str, int]:
    """CTranslate2 `Translator` thread options for `threads`.

    On the CPU, ``inter_threads=threads, intra_threads=1`` runs `threads` batches at once;
    the ct2 engine's per-budget groups are small, so this is measured to be faster than one
    batch at a time over `threads` intra-op threads (docs/results.md#engines_multi30k). ``threads=0`` on
    the CPU takes torch's thread count (module docstring); on a GPU it keeps CTranslate2's
    defaults.
    """
    if check_threads(threads) == 0:
        if device_kind != "cpu":
            return {}
        import torch

        threads = torch.get_num_threads()
    if device_kind == "cpu":
        return {"inter_threads": threads, "intra_threads": 1}
    return {"intra_threads": threads}


__all__ = ["TOKENIZER_TRAIN_THREADS", "check_threads", "ct2_thread_options", "use_threads"]
