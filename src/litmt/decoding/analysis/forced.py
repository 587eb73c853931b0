"""Forced decoding: a trained model's log-probability and score of given (source, target)
pairs, for reranking and corpus filtering (`ForcedDecoder`; the ``scripts/score.py`` command).

"Score" means what it means everywhere in litmt: the length-normalised log-probability that
ranks hypotheses (`litmt.decoding.search.rules.Hypothesis.score`), never BLEU.

For a target y (subword ids, without bos/eos) of a source x, the numbers are the ones beam
search gives a finished hypothesis (`litmt.decoding.search.beam`, `Hypothesis.log_prob` / `.score`):

    log_prob = sum over i = 1 .. |y| + 1 of log P(y_i | y_<i, x), with y_{|y|+1} = eos
    score    = log_prob / length_penalty_factor(|y| + 1, alpha)

eos counts, both in the sum and in the length. The log-softmax runs in float32, as in the
searches. Sources are prepared as `Translator` prepares them (control characters removed,
truncated to `max_positions`). Conventions at the edges:

- an empty source (as `Translator` gives ``""`` without running the model): an empty target
  scores 0.0 / 0.0, any other ``-inf``;
- a target longer than ``max_positions - 1`` subwords, which no search can produce, scores
  ``-inf`` (with a warning);
- the search's length budget (`max_len_a`/`max_len_b`) and `min_len` are not applied.

Shapes: B pairs in a batch, S source length, T target length + 1 (bos/eos), V vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.batching import padded, token_batches
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.rules import NEG_INF, length_penalty_factor
from litmt.decoding.translator import Translator
from litmt.errors import ConfigError, DataError
from litmt.models import Seq2SeqTransformer
from litmt.runtime.precision import autocast_context

log = logging.getLogger(__name__)


@dataclass
class PairScore:
    """The model's scores of one (source, target) pair.

    Attributes:
        log_prob: total log-probability of the target's subwords and eos.
        score: `log_prob` / ((5 + tokens) / 6) ** alpha, beam search's ranking score.
        tokens: subwords scored, eos included (|y| + 1); 0 for an empty source.
    """

    log_prob: float
    score: float
    tokens: int


@torch.no_grad()
def target_log_probs(
    model: Seq2SeqTransformer, src: Tensor, targets: Sequence[Sequence[int]]
) -> Tensor:
    """Total log-probability of each target (its subwords and eos) given its source.

    Args:
        model: the model, in eval mode.
        src: (B, S) source ids, right-padded with `PAD_ID`, every row non-empty.
        targets: B lists of target ids without bos/eos.

    Returns:
        (B,) float32 sums of log P(y_i | y_<i, x) over the |y| + 1 positions.
    """
    device = src.device
    tgt_in = padded([[BOS_ID, *t] for t in targets], PAD_ID).to(device)  # (B, T)
    tgt_out = padded([[*t, EOS_ID] for t in targets], PAD_ID).to(device)  # (B, T)
    logp = F.log_softmax(model(src, tgt_in).float(), dim=-1)  # (B, T, V), as the searches
    token_logp = logp.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return token_logp.masked_fill(tgt_out.eq(PAD_ID), 0.0).sum(dim=1)  # (B,)


class ForcedDecoder:
    """Force-decodes pairs with a `Translator`'s model, tokenizer and source preparation.

    >>> ForcedDecoder(litmt.load_translator("model.ckpt")).force_decode(["A dog."], ["Ein Hund."])

    Args:
        translator: a torch-engine `Translator` (`litmt.load_translator`, the one loader).
    """

    def __init__(self, translator: Translator) -> None:
        if translator.model is None:
            raise ConfigError("forced decoding needs the torch engine (engine=torch)")
        self.translator = translator

    def force_decode_ids(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        *,
        length_penalty: float = DecodeConfig.length_penalty,
        max_tokens: int = 4096,
    ) -> list[PairScore]:
        """Force-decode prepared id pairs in token-budget batches; results in input order.

        A batch holds at most `max_tokens` of max(source, target + 1) lengths, padding
        included (`litmt.decoding.batching.token_batches`).
        """
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} targets")
        model, device = self.translator.model, self.translator.device
        limit = model.config.max_positions - 1  # the longest output a search can produce
        results: list[PairScore] = [PairScore(NEG_INF, NEG_INF, 0) for _ in sources]
        todo = []
        for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
            if not s:
                if not t:
                    results[i] = PairScore(0.0, 0.0, 0)
                else:
                    log.warning(
                        "pair %d: empty source with a %d-subword target; scored -inf", i + 1, len(t)
                    )
            elif len(t) > limit:
                log.warning(
                    "pair %d: the target has %d subwords, more than the model's maximum of "
                    "%d; scored -inf",
                    i + 1,
                    len(t),
                    limit,
                )
                results[i] = PairScore(NEG_INF, NEG_INF, len(t) + 1)
            else:
                todo.append(i)
        lengths = [max(len(sources[i]), len(targets[i]) + 1) for i in todo]
        for batch in token_batches(lengths, max_tokens):
            idx = [todo[j] for j in batch]
            src = padded([sources[i] for i in idx], PAD_ID).to(device)  # (B, S)
            # the Translator's autocast: a flash/te checkpoint's kernel computes in half only
            with autocast_context(device, self.translator.autocast):
                totals = target_log_probs(model, src, [targets[i] for i in idx]).tolist()
            for i, total in zip(idx, totals, strict=True):
                n = len(targets[i]) + 1  # eos included, as in the searches
                norm = total / float(length_penalty_factor(float(n), length_penalty))
                results[i] = PairScore(total, norm, n)
        return results

    def force_decode(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        *,
        length_penalty: float = DecodeConfig.length_penalty,
        max_tokens: int = 4096,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        allow_zero_shot: bool = False,
    ) -> list[PairScore]:
        """Force-decode text pairs (sources prepared as `Translator.prepare` does).

        Args:
            src_lang, tgt_lang, allow_zero_shot: the direction (`Translator.route`): a
                multilingual model's language token goes on the source, or first in the
                target (then its log-probability counts, as a forced prefix's does).

        Raises:
            DataError: the two lists differ in length. ConfigError: an unknown direction.
        """
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} targets")
        tr = self.translator
        route = tr.route(src_lang, tgt_lang, allow_zero_shot=allow_zero_shot)
        src_ids = [tr.prepare(s, f"line {i + 1}") for i, s in enumerate(sources)]
        src_ids = [route.source_ids(ids, tr.max_source_tokens) for ids in src_ids]
        tgt_ids = tr.tokenizer.encode_tgt(list(targets)) if targets else []
        tgt_ids = [route.prefix_ids(ids) or [] for ids in tgt_ids]
        return self.force_decode_ids(
            src_ids, tgt_ids, length_penalty=length_penalty, max_tokens=max_tokens
        )


__all__ = ["ForcedDecoder", "PairScore", "target_log_probs"]
