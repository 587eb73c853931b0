"""Target prefixes on CTranslate2 under litmt's beam-search rules (the ct2 engine's helper).

Read in CTranslate2's ``src/decoding.cc`` (``BeamSearch::search``, ``update_sample_with_prefix``,
``is_last_step``, ``apply_min_length``, ``finalize_result``) for the Python API's default
``return_prefix=true``: a prefix of P tokens is forced at steps 0..P-1 of the search, step P is
the first free one. Four of its rules part from litmt's beam search (`litmt.decoding.search.beam`):

1. ``update_sample_with_prefix``: at step P, an eos among the candidates of any beam but the
   first becomes id 0 (``<blank>``) with score -1e10 (CTranslate2's issue #277). litmt
   finishes ``prefix + eos`` whenever eos is among the K best candidates of step P, and goes
   on with the K best other tokens. Where eos ranks 2nd to Kth there, CTranslate2 goes on with
   a dead beam and never offers ``prefix + eos`` (the 1-best of a prefix that is already a
   whole sentence). The engine finds those sentences first (`secondary_eos`: the search cut
   at step P), decodes them with eos blocked at step P (``min_decoding_length = P + 1``:
   CTranslate2's K beams are then litmt's K live beams) and adds ``prefix + eos`` itself (its
   log-probability from ``score_batch``, as for every prefixed hypothesis). Where eos is the
   best candidate of step P, CTranslate2 finishes ``prefix + eos`` like litmt.
2. ``is_last_step``: every beam is registered at the budget's last step, so a budget equal to
   P gives K copies of the prefix (litmt: ``prefix + eos`` once). `distinct` keeps one.
3. At a budget of P + 1 the replaced eos of (1) is registered as ``prefix + <blank>``; after
   (1) this no longer happens, and `distinct` drops any hypothesis holding id 0, with a warning.
4. ``finalize_result``: once K hypotheses have finished, CTranslate2 keeps the K best by its
   own score, log P / len ** alpha, where the prefix steps add nothing to log P; litmt keeps
   the K best by GNMT, prefix included. The two orders differ far more than without a prefix,
   and a hypothesis litmt ranks first can be dropped. (With alpha = 0 CTranslate2 stops when
   its best beam has ended and n_best have finished, litmt when K have.) So a sentence with a
   prefix is searched to the end of its budget with every finished hypothesis returned
   (`Call.exhaustive`); the engine keeps those litmt's search holds when it stops, ``prefix +
   eos`` of (1) counted (`finished_before_stop`), and ranks them by GNMT. The cost: decoding
   steps up to the budget instead of up to the Kth finished hypothesis.

Hypotheses here are (tokens, log-probability) pairs, tokens without bos/eos; K is the beam size.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from litmt.data.tokenization.tokenizer import PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.translator_base import DecodeRequest

log = logging.getLogger("litmt.deploy.engines.ct2_prefix")

Found = list[tuple[list[int], float]]

# update_sample_with_prefix gives a replaced eos this score; a real hypothesis is far above.
_REPLACED_EOS_SCORE = -1e9


def secondary_eos(
    ct2: Any,
    sources: Sequence[list[str]],
    prefixes: Sequence[list[str]],
    *,
    beam_size: int,
    min_len: int,
    max_batch_size: int,
) -> list[bool]:
    """Per sentence: whether eos ranks 2nd to Kth among the candidates right after its prefix.

    A search of P + 1 steps (P = len(prefix), ``max_decoding_length = P + 1``, one call per
    prefix length) registers the K best candidates of step P (``is_last_step``): eos in first
    place ends a hypothesis equal to the prefix, eos in another place comes back as
    ``prefix + <blank>`` with the score -1e10 (``update_sample_with_prefix``).

    Args:
        ct2: the ``ctranslate2.Translator``.
        sources, prefixes: pieces per sentence (each prefix non-empty, each sentence's budget
            above its prefix length, and ``min_len <= P``: eos allowed at step P).
        beam_size: K (> 1).
        min_len: litmt's ``min_len`` (CTranslate2's ``min_decoding_length``).
        max_batch_size: padded source tokens per batch.
    """
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, prefix in enumerate(prefixes):
        by_length[len(prefix)].append(i)
    pending = [
        (
            idx,
            ct2.translate_batch(
                [sources[i] for i in idx],
                [prefixes[i] for i in idx],
                max_batch_size=max_batch_size,
                batch_type="tokens",
                beam_size=beam_size,
                num_hypotheses=beam_size,
                length_penalty=0.0,
                return_scores=True,
                max_input_length=0,
                max_decoding_length=length + 1,
                min_decoding_length=min_len,
                asynchronous=True,
            ),
        )
        for length, idx in sorted(by_length.items())
    ]
    out = [False] * len(prefixes)
    for idx, futures in pending:
        for i, future in zip(idx, futures, strict=True):
            result = future.result()
            out[i] = any(
                len(h) == len(prefixes[i]) + 1 and score < _REPLACED_EOS_SCORE
                for h, score in zip(result.hypotheses, result.scores, strict=True)
            )
    return out


def distinct(found: Found) -> Found:
    """`found` without repeats (the first of equal token lists kept) and without hypotheses
    holding id 0, CTranslate2's replacement for an eos it refuses (module docstring, 2 and 3)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for tokens, log_prob in found:
        if PAD_ID in tokens:
            log.warning("dropped a CTranslate2 hypothesis holding <blank> (a replaced eos)")
            continue
        if tuple(tokens) not in seen:
            seen.add(tuple(tokens))
            out.append((tokens, log_prob))
    return out


def finished_before_stop(found: Found, beam_size: int, counted: int = 0) -> Found:
    """Of every hypothesis an exhaustive call finished (`Call`), those litmt's search holds
    when it stops, with `counted` more finished outside `found` (``prefix + eos``, rule 1).

    litmt's search stops once K hypotheses have finished (`beam_done`; its other stop rule
    only ends searches that could not improve the n-best); a hypothesis of n tokens finished at
    step n. So it holds those finished by the step where its (K - counted)th one finishes.
    """
    if len(found) < beam_size - counted:
        return found
    stop = sorted(len(tokens) for tokens, _ in found)[beam_size - counted - 1]
    return [(tokens, log_prob) for tokens, log_prob in found if len(tokens) <= stop]


def returns_every_beam(config: DecodeConfig) -> bool:
    """Whether CTranslate2 returns every finished beam, rescored by the engine with GNMT
    (`litmt.deploy.engines.ct2` module docstring): beam search with a length penalty."""
    return config.beam_size > 1 and config.length_penalty != 0


@dataclass(frozen=True)
class Call:
    """The settings that tell one CTranslate2 call of a request from another.

    Attributes:
        budget: the output budget of its sentences (``max_decoding_length``).
        min_len: no eos before this many tokens (``min_decoding_length``): litmt's
            ``min_len``, or P + 1 where eos is blocked after a prefix of P tokens (rule 1).
        exhaustive: sentences with a prefix, or an n-best at length penalty 0, searched to
            the end of the budget with every finished hypothesis returned, for
            `finished_before_stop` (rule 4). The Python
            API's ``patience``: "the decoding will continue until beam_size*patience
            hypotheses are finished"; at most K finish per step, so budget + 1 is never
            reached, and ``num_hypotheses`` may be up to K * patience
            (``validate_decoding_options``).
    """

    budget: int
    min_len: int
    exhaustive: bool

    def search_options(self, config: DecodeConfig) -> dict[str, Any]:
        """The keyword arguments of ``translate_batch`` that set this call's search."""
        every_beam, k = returns_every_beam(config), config.beam_size
        patience = self.budget + 1 if self.exhaustive else 1
        return {
            "beam_size": k,
            "patience": patience,
            "num_hypotheses": k * patience if every_beam or self.exhaustive else config.n_best,
            "length_penalty": config.length_penalty if every_beam else 0.0,
            "max_decoding_length": self.budget,
            "min_decoding_length": min(self.min_len, self.budget),
        }


def plan_calls(
    request: DecodeRequest, budgets: Sequence[int], blocked: set[int]
) -> dict[Call, list[int]]:
    """The sentences of ``request.todo`` (`budgets`: theirs) grouped into CTranslate2 calls,
    in order of budget; `blocked`: those whose eos is blocked after their prefix (rule 1)."""
    config, prefixes = request.config, request.prefixes
    calls: dict[Call, list[int]] = defaultdict(list)
    for i, budget in zip(request.todo, budgets, strict=True):
        prefix = prefixes[i] if prefixes is not None else None
        min_len = max(config.min_len, len(prefix) + 1) if i in blocked else config.min_len
        # n-best without a length penalty: CTranslate2 stops once its top beam has finished
        # and n_best have (allow_early_exit), litmt once K have or its n_best-th beats every
        # live beam; an exhaustive call and `finished_before_stop` give litmt's n-best
        n_best_at_alpha_0 = config.n_best > 1 and not returns_every_beam(config)
        exhaustive = (bool(prefix) or n_best_at_alpha_0) and config.beam_size > 1
        calls[Call(budget, min_len, exhaustive)].append(i)
    return dict(sorted(calls.items(), key=lambda item: dataclasses.astuple(item[0])))


__all__ = [
    "Call",
    "Found",
    "distinct",
    "finished_before_stop",
    "plan_calls",
    "returns_every_beam",
    "secondary_eos",
]
