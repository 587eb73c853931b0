"""What every search shares: its result (`Hypothesis`), the model it steps (`StepModel`), the
argument checks, the output budget and its floor, the rules each step applies to the
log-probabilities (``min_len``, eos forced at the budget, target prefixes), the beam a
constrained sentence needs and the grouping of sentences by it, and the lock step of
``sync_steps``. Each part has its own unit test (``tests/unit/decoding/search/test_search_rules.py``).

Shapes: B sentences, R rows decoded token by token, S source length, P longest prefix,
t tokens generated so far, V target vocabulary, L longest allowed hypothesis (tokens, eos
excluded).

Conventions every search keeps:

- A hypothesis is a list of target ids *without* bos and eos.
- Its length |y| for the length penalty counts the generated tokens *including* eos.
- Score = log P(y, eos | x) / lp(|y|) with the GNMT penalty lp(n) = ((5 + n) / 6) ** alpha
  (alpha = ``length_penalty``; 0 ranks by raw log-probability).
- A sentence may produce at most ``max_len = min(floor(a * src_len + b), max_positions - 1)``
  tokens before eos (src_len = non-pad source tokens; `output_budgets`, also the ct2 engine's);
  at that point eos is forced.
- ``min_len`` (default 0) suppresses eos until a hypothesis has that many tokens (the
  budget still wins: a sentence whose budget is below ``min_len`` ends at its budget).
- ``prefixes`` (optional, one list of target ids per source, may be empty): the hypothesis
  begins with those ids. At step t < len(prefix) every token but prefix[t] is -inf, so the
  prefix tokens' own log-probabilities count in ``log_prob`` and ``score`` (the numbers
  `litmt.decoding.analysis.forced` gives for the whole output). The budget counts the prefix: it is
  raised to at least len(prefix) (`output_budgets`' ``floor``), so a prefix that is a whole
  translation is reproduced, with eos forced after it.
- ``sync_steps`` (default False): every rank of the default `torch.distributed` group runs
  the same number of decoder steps (a rank whose sentences are all done keeps calling
  `decode_step` on its finished rows and ignores the result until every rank is done). Set
  it under a strategy that shards parameters (FSDP): each decoder layer all-gathers its
  weights on every call, so ranks stepping a different number of times would hang. One
  all-reduce of a flag per step; the hypotheses are those of the unsynchronised search.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from litmt.data.tokenization.tokenizer import EOS_ID, PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.errors import ConfigError
from litmt.models import TransformerConfig

NEG_INF = float("-inf")


class StepModel(Protocol):
    """What the searches need of a model: a `Seq2SeqTransformer`, or an `Ensemble` of them.

    ``encode(src)`` gives (memory, src_padding_mask); ``init_state`` makes the decoder
    state (with ``reorder(index, cross=...)``); ``decode_step(tokens (R,), state)`` gives
    next-token scores (R, V) whose log-softmax is the model's log-probabilities.
    """

    config: TransformerConfig

    def encode(self, src: Tensor) -> tuple[Any, Tensor]: ...

    def init_state(
        self, memory: Any, src_padding_mask: Tensor | None, capacity: int | None = None
    ) -> Any: ...

    def decode_step(self, tokens: Tensor, state: Any) -> Tensor: ...


@dataclass
class Hypothesis:
    """One finished translation.

    Attributes:
        tokens: target ids without bos/eos.
        score: length-normalised log-probability (the ranking score).
        log_prob: total log-probability of tokens + eos.
        constraints_met: it holds every constraint of its sentence (always, without
            constraints); False only for a constrained search's fallback, the best
            hypothesis when none within the budget meets them all.
    """

    tokens: list[int]
    score: float
    log_prob: float
    constraints_met: bool = True

    @classmethod
    def normalised(cls, tokens: list[int], log_prob: float, alpha: float) -> Hypothesis:
        """The hypothesis with its GNMT score: log_prob / lp(len(tokens) + 1), eos counted."""
        return cls(
            tokens, log_prob / float(length_penalty_factor(len(tokens) + 1.0, alpha)), log_prob
        )


def length_penalty_factor(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def output_budgets(
    src_lengths: Tensor | Sequence[int],
    max_len_a: float,
    max_len_b: int,
    max_positions: int,
    floor: Tensor | Sequence[int] | None = None,
) -> Tensor:
    """The output budget of every engine (torch search, CTranslate2): the most tokens each
    sentence may produce before eos, min(max(floor(a * src_len + b), floor), max_positions - 1),
    >= 0.

    Args:
        src_lengths: (B,) non-pad source tokens per sentence (a tensor or a list).
        max_len_a, max_len_b: a and b (`DecodeConfig`).
        max_positions: the model's.
        floor: (B,) tokens a sentence must be able to hold whatever its source length:
            its target prefix plus its constraints (`budget_floor`);
            None = 0.

    Returns:
        (B,) long tensor (on `src_lengths`' device; the CPU for a list). The floor is taken
        in float64, so every engine rounds alike.
    """
    src_len = torch.as_tensor(src_lengths).to(torch.float64)  # (B,)
    budget = torch.floor(src_len * max_len_a + max_len_b).long()
    if floor is not None:
        budget = torch.maximum(budget, torch.as_tensor(floor, device=budget.device).long())
    return budget.clamp(min=0, max=max_positions - 1)


def check_source(model: StepModel, src: Tensor) -> None:
    """Raise on a source that is not (B, S) ids or is longer than the model's max_positions."""
    if src.dim() != 2:
        raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")
    if src.size(1) > model.config.max_positions:
        raise ConfigError(
            f"source of {src.size(1)} tokens exceeds the model's max_positions="
            f"{model.config.max_positions}; truncate the input"
        )


def check_search_args(
    model: StepModel,
    src: Tensor,
    *,
    min_len: int,
    beam_size: int | None = None,
    n_best: int = 1,
) -> None:
    """The argument checks of every search, each a one-line error.

    Args:
        model, src: as the searches take them (`check_source`).
        min_len: >= 0.
        beam_size: a beam search's K (>= 1, and 2K at most the target vocabulary); None for
            the searches without a beam.
        n_best: a beam search's hypotheses per sentence (1 .. K).

    Raises:
        ConfigError: a setting out of range. ValueError: `src` is not (B, S).
    """
    check_source(model, src)
    if min_len < 0:
        raise ConfigError(f"min_len must be >= 0, got {min_len}")
    if beam_size is None:
        return
    if beam_size < 1:
        raise ConfigError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ConfigError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    vocab = model.config.tgt_vocab_size
    if 2 * beam_size > vocab:
        raise ConfigError(f"beam_size={beam_size} is too large for a target vocabulary of {vocab}")


def constrain_eos(logp: Tensor, step: int, min_len: int, eos: int, budget: Tensor | None) -> None:
    """In place on logp (R, V): no eos before `min_len`; only eos where budget (R,) == step.

    Pass `budget` only at steps where some row reaches it (the mask is (R, V)).
    """
    if step < min_len:
        logp[:, eos] = NEG_INF
    if budget is not None:
        at_budget = budget.eq(step)[:, None]  # (R, 1)
        keep = torch.arange(logp.size(-1), device=logp.device).eq(eos)  # (V,)
        logp.masked_fill_(at_budget & ~keep, NEG_INF)


def prefix_table(prefixes: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """(B, P) prefix ids right-padded with pad, and (B,) their lengths (P = longest, >= 1)."""
    width = max(1, max((len(p) for p in prefixes), default=0))
    table = torch.full((len(prefixes), width), PAD_ID, dtype=torch.long)  # (B, P)
    for i, p in enumerate(prefixes):
        table[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long)  # (B,)
    return table.to(device), lengths.to(device)


def force_prefix(logp: Tensor, step: int, table: Tensor, lengths: Tensor) -> None:
    """In place on logp (R, V): rows still inside their prefix (lengths (R,) > step) keep only
    the log-probability of prefix token ``table[:, step]`` (table (R, P)); the rest is -inf."""
    inside = lengths.gt(step)[:, None]  # (R, 1)
    want = table[:, min(step, table.size(1) - 1)]  # (R,)
    vocab = torch.arange(logp.size(-1), device=logp.device)  # (V,)
    logp.masked_fill_(inside & vocab.ne(want[:, None]), NEG_INF)


def _where(i: int, n: int) -> str:
    return "" if n == 1 else f" (sentence {i + 1})"


def budget_floor(
    max_positions: int,
    prefixes: Sequence[Sequence[int]] | None = None,
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
) -> list[int]:
    """Per sentence, the tokens its output must be able to hold: its prefix plus all its
    constraints (the floor of `litmt.decoding.search.rules.output_budgets`).

    Raises:
        ConfigError: a sentence needs more than the model's ``max_positions - 1`` tokens.
    """
    n = len(prefixes) if prefixes is not None else len(constraints or [])
    floor = [0] * n
    for i in range(n):
        if prefixes is not None:
            floor[i] += len(prefixes[i])
        if constraints is not None:
            floor[i] += sum(len(c) for c in constraints[i])
    limit = max_positions - 1
    for i, f in enumerate(floor):
        if f > limit:
            raise ConfigError(
                f"the prefix and constraints{_where(i, n)} need {f} target tokens, more than "
                f"the model's maximum output of {limit}; shorten them"
            )
    return floor


def constrained_beam(beam_size: int, constraints: Sequence[Sequence[int]]) -> int:
    """The beam a sentence with these constraints (target id lists) is searched with: at least
    its constraint pieces C + 1, one beam for each bank of the dynamic beam allocation (0 .. C
    constraint tokens placed; `litmt.decoding.search.constrained`); else `beam_size`."""
    return max(beam_size, sum(len(c) for c in constraints) + 1 if constraints else 0)


def beam_groups(
    config: DecodeConfig, constraints: Sequence[Sequence[Sequence[int]]], rows: Iterable[int]
) -> list[tuple[int, list[int]]]:
    """`rows` grouped by the beam each is searched with (`constrained_beam` of its
    constraints under ``config``'s beam: 1 for greedy), smallest beam first, input order kept
    inside a group; a constrained search runs once per group (the torch engine batches each
    group apart, `litmt.decoding.search.dispatch.decode` splits a mixed batch)."""
    beam = config.beam_size if config.method == "beam" else 1
    groups: dict[int, list[int]] = {}
    for i in rows:
        groups.setdefault(constrained_beam(beam, constraints[i]), []).append(i)
    return sorted(groups.items())


def shared_limits(
    config: DecodeConfig, sync_steps: bool, prefixes: Sequence[Sequence[int]] | None
) -> dict[str, Any]:
    """The keywords `decode_rows` and `beam_search` share, from a `DecodeConfig` (the output
    budget, length penalty and min_len) plus `sync_steps` and `prefixes`."""
    return dict(
        max_len_a=config.max_len_a,
        max_len_b=config.max_len_b,
        length_penalty=config.length_penalty,
        min_len=config.min_len,
        sync_steps=sync_steps,
        prefixes=prefixes,
    )


@dataclass(frozen=True)
class StepRules:
    """The rules every search applies to each step's log-probabilities, per sentence.

    Attributes:
        budget: (B,) long, the most tokens each sentence may produce before eos
            (`output_budgets`, raised to hold its prefix and constraints).
        min_len: no eos before this many tokens.
        prefix: the (B, P) prefix table and (B,) lengths (`prefix_table`), or None.
        force_steps: the steps at which some sentence reaches its budget.
    """

    budget: Tensor
    min_len: int
    prefix: tuple[Tensor, Tensor] | None
    force_steps: frozenset[int]

    @classmethod
    def build(
        cls,
        model: StepModel,
        src: Tensor,
        max_len_a: float,
        max_len_b: int,
        min_len: int,
        prefixes: Sequence[Sequence[int]] | None = None,
        constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> StepRules:
        """The rules for a batch src (B, S); `prefixes`, `constraints` as the searches take."""
        max_positions = model.config.max_positions
        floor = None
        if prefixes is not None or constraints is not None:
            floor = budget_floor(max_positions, prefixes, constraints)
        budget = output_budgets(src.ne(PAD_ID).sum(1), max_len_a, max_len_b, max_positions, floor)
        prefix = None if prefixes is None else prefix_table(prefixes, src.device)
        return cls(budget.to(src.device), min_len, prefix, frozenset(budget.tolist()))

    @property
    def steps(self) -> int:
        """Decoder steps the longest sentence may need: its budget plus the eos."""
        return int(self.budget.max()) + 1

    def apply(self, logp: Tensor, step: int, sentence: Tensor) -> None:
        """In place on logp (R, V) at `step`: `constrain_eos` (min_len; eos only at the
        budget) and `force_prefix`, for rows of sentences `sentence` (R,)."""
        at_budget = self.budget[sentence] if step in self.force_steps else None
        constrain_eos(logp, step, self.min_len, EOS_ID, at_budget)
        if self.prefix is not None and step < self.prefix[0].size(1):
            force_prefix(logp, step, self.prefix[0][sentence], self.prefix[1][sentence])


def global_max(value: int, device: torch.device) -> int:
    """The largest `value` over the ranks of the default process group (a collective)."""
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def loop_steps(rules: StepRules, sync_steps: bool, device: torch.device) -> int:
    """The search loop's bound: this rank's `rules.steps`, or every rank's most under
    `sync_steps` (a collective)."""
    return global_max(rules.steps, device) if sync_steps else rules.steps


def all_done(done_here: bool, sync_steps: bool, device: torch.device) -> bool:
    """Whether the search loop ends: when this rank is done or, under `sync_steps`, when
    every rank is (a collective every rank calls at every step)."""
    if not sync_steps:
        return done_here
    return global_max(int(not done_here), device) == 0


__all__ = [
    "NEG_INF",
    "Hypothesis",
    "StepModel",
    "StepRules",
    "all_done",
    "beam_groups",
    "budget_floor",
    "check_search_args",
    "check_source",
    "constrain_eos",
    "constrained_beam",
    "force_prefix",
    "global_max",
    "length_penalty_factor",
    "loop_steps",
    "output_budgets",
    "prefix_table",
    "shared_limits",
]
