"""Greedy and batched beam search over `decode_step` (KV-cache decoding); `litmt.decoding.dispatch.decode`
is the one entry point that picks a search (and samples) from a `DecodeConfig`.

Shapes: B sentences, K beam size, R rows decoded token by token (B*n), S source length,
t tokens generated so far, V target vocabulary, L longest allowed hypothesis (tokens, eos
excluded).

Conventions shared by both searches:

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
  `litmt.decoding.forced` gives for the whole output). The budget counts the prefix: it is
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from litmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.steering import budget_floor
from litmt.errors import ConfigError
from litmt.models import TransformerConfig

NEG_INF = float("-inf")
_D = DecodeConfig()  # the keyword defaults below are the project's one set


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
    """

    tokens: list[int]
    score: float
    log_prob: float


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
            its target prefix plus its constraints (`litmt.decoding.steering.budget_floor`);
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


def topk_rows(x: Tensor, k: int, chunk: int = 64) -> tuple[Tensor, Tensor]:
    """Exact top-k along the last dim of `x` (R, N): values and indices (R, k), sorted.

    Two passes instead of one `torch.topk` over N: the maxima of chunks of `chunk`
    elements, then `topk` over the k chunks with the largest maxima (every top-k element
    lies in one of them: the k largest chunk maxima are k elements at least as large as
    anything in the other chunks). On CPU this is 2-3x faster than `torch.topk` for
    N = K * V = 40000, k = 10, which beam search runs at every step. Ties may come out in
    another order than `torch.topk`'s.
    """
    r, n = x.shape
    n_chunks = n // chunk
    if n_chunks <= 2 * k:
        return x.topk(k, dim=-1)
    body = x[:, : n_chunks * chunk].view(r, n_chunks, chunk)  # (R, C, chunk)
    chunk_max = body.amax(dim=-1)  # (R, C)
    if n_chunks * chunk < n:  # a shorter last chunk
        chunk_max = torch.cat([chunk_max, x[:, n_chunks * chunk :].amax(-1, keepdim=True)], 1)
    best_chunks = chunk_max.topk(k, dim=-1).indices  # (R, k)
    offsets = torch.arange(chunk, device=x.device)  # (chunk,)
    pos = (best_chunks[:, :, None] * chunk + offsets).view(r, k * chunk)  # (R, k*chunk)
    pos = pos.clamp_(max=n - 1)  # the short last chunk repeats its last element
    values, sub = x.gather(1, pos).topk(k, dim=-1)  # (R, k)
    return values, pos.gather(1, sub)


def check_source(model: StepModel, src: Tensor) -> None:
    """Raise on a source that is not (B, S) ids or is longer than the model's max_positions."""
    if src.dim() != 2:
        raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")
    if src.size(1) > model.config.max_positions:
        raise ConfigError(
            f"source of {src.size(1)} tokens exceeds the model's max_positions="
            f"{model.config.max_positions}; truncate the input"
        )


def _check_min_len(min_len: int) -> None:
    if min_len < 0:
        raise ConfigError(f"min_len must be >= 0, got {min_len}")


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


def _global_max(value: int, device: torch.device) -> int:
    """The largest `value` over the ranks of the default process group (a collective)."""
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _stop(done_here: bool, sync_steps: bool, device: torch.device) -> bool:
    """Whether the search loop ends: when this rank is done or, under `sync_steps`, when
    every rank is (a collective every rank calls at every step)."""
    if not sync_steps:
        return done_here
    return _global_max(int(not done_here), device) == 0


TokenRule = Callable[[Tensor, Tensor], Tensor]
"""``rule(logits, logp) -> tokens``: the next token (R,) of each row from the step's logits
(R, V) and their log-softmax under the length constraints (R, V) (-inf where forbidden)."""


def _argmax(logits: Tensor, logp: Tensor) -> Tensor:
    return logp.argmax(dim=-1)  # (R,)


@torch.no_grad()
def decode_rows(
    model: StepModel,
    src: Tensor,
    *,
    n: int = 1,
    rule: TokenRule = _argmax,
    max_len_a: float = _D.max_len_a,
    max_len_b: int = _D.max_len_b,
    length_penalty: float = _D.length_penalty,
    min_len: int = _D.min_len,
    sync_steps: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[Hypothesis]:
    """Decode `n` rows per source (R = B * n rows) one token at a time with `rule`.

    The encoder runs once per source; its state is fanned out to the n rows. Stops as soon as
    every row has emitted eos. A hypothesis's ``log_prob`` is the model's own
    log-probability of its tokens, ``score`` its GNMT normalisation.

    Args:
        model: the model, in eval mode (or an `Ensemble`).
        src: (B, S) source ids, right-padded with `pad_id`.
        n: rows per source.
        rule: picks each row's next token (default: the most likely one, greedy).
        max_len_a, max_len_b: output budget a * src_len + b (see module docstring).
        length_penalty: alpha, used only for the reported `score`.
        min_len: no eos before this many tokens (see module docstring).
        sync_steps: every rank runs the same number of decoder steps (see module docstring).
        prefixes: B lists of target ids each output starts with (see module docstring);
            None = none.

    Returns:
        R hypotheses, row r decoding source r // n.
    """
    check_source(model, src)
    _check_min_len(min_len)
    bsz, device = src.size(0), src.device
    if bsz == 0:
        return []
    floor = budget_floor(model.config.max_positions, prefixes) if prefixes is not None else None
    budget = output_budgets(
        src.ne(PAD_ID).sum(1), max_len_a, max_len_b, model.config.max_positions, floor
    )
    budget = budget.to(device).repeat_interleave(n)  # (R,)
    forced = None if prefixes is None else prefix_table(prefixes, device)
    if forced is not None:  # (R, P), (R,)
        forced = (forced[0].repeat_interleave(n, 0), forced[1].repeat_interleave(n))
    rows = bsz * n
    steps = int(budget.max()) + 1  # this rank's; under sync_steps, every rank's longest
    if sync_steps:
        steps = _global_max(steps, device)
    memory, mask = model.encode(src)
    state = model.init_state(memory, mask, capacity=steps)
    if n > 1:
        state.reorder(torch.arange(bsz, device=device).repeat_interleave(n), cross=True)  # B -> R
    tokens = torch.full((rows,), BOS_ID, dtype=torch.long, device=device)  # (R,)
    out = torch.full((rows, int(budget.max()) + 1), PAD_ID, dtype=torch.long, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # (R,)
    log_prob = torch.zeros(rows, dtype=torch.float32, device=device)  # (R,)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) incl. eos
    force_steps = set(budget.tolist())  # steps at which some row must emit eos
    done_here = False
    for step in range(steps):
        if done_here:  # sync_steps only: another rank still decodes; match its collectives
            model.decode_step(tokens, state)
        else:
            logits = model.decode_step(tokens, state).float()  # (R, V)
            logp = F.log_softmax(logits, dim=-1)  # the model's distribution, for log_prob
            constrain_eos(logp, step, min_len, EOS_ID, budget if step in force_steps else None)
            if forced is not None and step < forced[0].size(1):
                force_prefix(logp, step, *forced)
            tokens = rule(logits, logp).masked_fill(finished, PAD_ID)  # (R,)
            log_prob += logp.gather(1, tokens[:, None])[:, 0].masked_fill(finished, 0.0)
            lengths += (~finished).long()
            out[:, step] = tokens
            finished |= tokens.eq(EOS_ID)
            done_here = bool(finished.all())  # the one host sync per step
        if _stop(done_here, sync_steps, device):
            break
    score = log_prob / length_penalty_factor(lengths.float(), length_penalty)
    toks, lps, scs, lens = out.tolist(), log_prob.tolist(), score.tolist(), lengths.tolist()
    # row[: n - 1] drops eos and the padding after it
    return [Hypothesis(toks[r][: lens[r] - 1], scs[r], lps[r]) for r in range(rows)]


def greedy_search(
    model: StepModel,
    src: Tensor,
    *,
    max_len_a: float = _D.max_len_a,
    max_len_b: int = _D.max_len_b,
    length_penalty: float = _D.length_penalty,
    min_len: int = _D.min_len,
    sync_steps: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[Hypothesis]:
    """Batched greedy decoding (`decode_rows` with one row per source, argmax).

    Args:
        model: the model, in eval mode.
        src: (B, S) source ids, right-padded with `pad_id`.
        max_len_a, max_len_b: output budget a * src_len + b (see module docstring).
        length_penalty: alpha, used only for the reported `score`.
        min_len: no eos before this many tokens (see module docstring).
        sync_steps: every rank runs the same number of decoder steps (see module docstring).
        prefixes: B lists of target ids each output starts with; None = none.

    Returns:
        One `Hypothesis` per source row, in input order.
    """
    return decode_rows(
        model,
        src,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        length_penalty=length_penalty,
        min_len=min_len,
        sync_steps=sync_steps,
        prefixes=prefixes,
    )


@torch.no_grad()
def beam_search(
    model: StepModel,
    src: Tensor,
    *,
    beam_size: int = _D.beam_size,
    length_penalty: float = _D.length_penalty,
    max_len_a: float = _D.max_len_a,
    max_len_b: int = _D.max_len_b,
    n_best: int = _D.n_best,
    min_len: int = _D.min_len,
    sync_steps: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search with per-layer decode caches, GNMT length penalty and n-best output.

    Each step scores the K*V continuations of every sentence's K live beams, keeps the 2K
    best: eos candidates among the top K become finished hypotheses (kept, per sentence, in a
    device buffer of the K best by normalised score), the K best non-eos candidates live on.

    Stopping criterion, per sentence: it is done when (a) it has K finished hypotheses (the
    rule fairseq uses; it makes K = 1 identical to greedy), or (b) its n_best-th best
    finished score already beats the best score any live beam could still reach (its
    log-probability can only fall, and lp grows at most to lp(max_len + 1) when alpha > 0),
    or (c) it reached its length budget (eos forced). Done sentences are dropped from the
    batch (cache rows included); the search ends when every sentence is done.

    The first step runs one row per sentence (all K beams would be identical) and then fans
    the decoder state out to K rows per sentence. After that, beams move only within their
    sentence, so the source side of the state (cross-attention K/V) is not reordered.

    Args:
        model: the model, in eval mode.
        src: (B, S) source ids, right-padded with `pad_id`.
        beam_size: K.
        length_penalty: alpha of the GNMT penalty.
        max_len_a, max_len_b: output budget a * src_len + b.
        n_best: hypotheses returned per sentence (<= K), best first.
        min_len: no eos before this many tokens (see module docstring).
        sync_steps: every rank runs the same number of decoder steps (see module docstring).
        prefixes: B lists of target ids each output starts with (see module docstring); while
            a sentence is inside its prefix, only its best beam is alive (the others are -inf).

    Returns:
        For each source row, `n_best` hypotheses sorted by decreasing score.
    """
    check_source(model, src)
    _check_min_len(min_len)
    if beam_size < 1:
        raise ConfigError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ConfigError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    cfg = model.config
    bsz, k, device = src.size(0), beam_size, src.device
    if bsz == 0:
        return []
    vocab = model.config.tgt_vocab_size
    if 2 * k > vocab:
        raise ConfigError(f"beam_size={k} is too large for a target vocabulary of {vocab}")
    floor = budget_floor(cfg.max_positions, prefixes) if prefixes is not None else None
    budget = output_budgets(src.ne(PAD_ID).sum(1), max_len_a, max_len_b, cfg.max_positions, floor)
    forced = None if prefixes is None else prefix_table(prefixes, device)  # (B, P), (B,)
    max_steps = int(budget.max()) + 1
    steps = _global_max(max_steps, device) if sync_steps else max_steps  # loop bound

    memory, mask = model.encode(src)  # (B, S, C), (B, S)
    state = model.init_state(memory, mask, capacity=steps)  # one row per sentence first

    # Finished hypotheses of every sentence (global, indexed by original sentence id).
    fin_score = torch.full((bsz, k), NEG_INF, device=device)  # (B, K) normalised
    fin_logp = torch.full((bsz, k), NEG_INF, device=device)  # (B, K)
    fin_tokens = torch.full((bsz, k, max_steps), PAD_ID, dtype=torch.long, device=device)
    fin_len = torch.zeros((bsz, k), dtype=torch.long, device=device)  # tokens, eos excluded

    # Live state of the still-active sentences (b of them), `kk` rows (beams) each: one at
    # the first step, K after it.
    active = torch.arange(bsz, device=device)  # (b,) original ids
    scores = torch.zeros((bsz, 1), device=device)  # (b, kk) cumulative log-probs
    history = torch.empty((bsz, 0), dtype=torch.long, device=device)  # (b*kk, t)
    last = torch.full((bsz,), BOS_ID, dtype=torch.long, device=device)  # (b*kk,)
    arange_2k = torch.arange(2 * k, device=device)  # (2K,)
    lp_max = length_penalty_factor(budget.double() + 1, length_penalty).float()  # (B,)
    force_steps = set(budget.tolist())  # steps at which some sentence must emit eos

    done_here = False
    for step in range(steps):
        if done_here:  # sync_steps only: another rank still decodes; match its collectives
            model.decode_step(last, state)
            if _stop(True, sync_steps, device):
                break
            continue
        b, kk = active.numel(), scores.size(1)
        logp = F.log_softmax(model.decode_step(last, state).float(), dim=-1)  # (b*kk, V)
        rows_budget = budget[active].repeat_interleave(kk) if step in force_steps else None
        constrain_eos(logp, step, min_len, EOS_ID, rows_budget)
        if forced is not None and step < forced[0].size(1):
            rows = active.repeat_interleave(kk)  # (b*kk,) sentence of each row
            force_prefix(logp, step, forced[0][rows], forced[1][rows])
        cand = logp.view(b, kk, vocab).add_(scores[:, :, None]).view(b, kk * vocab)
        top_val, top_idx = topk_rows(cand, 2 * k)  # (b, 2K)
        top_beam, top_tok = top_idx // vocab, top_idx % vocab  # (b, 2K)
        is_eos = top_tok.eq(EOS_ID)  # (b, 2K)

        # -- finish: eos candidates among the top K, merged into each sentence's buffer.
        new_fin = is_eos[:, :k] & torch.isfinite(top_val[:, :k])  # (b, K)
        n_tok = step + 1  # generated tokens incl. eos
        # On CPU, skip the merge when nothing finishes (most steps); on a GPU always merge
        # rather than add a host sync.
        if device.type != "cpu" or bool(new_fin.any()):
            new_score = torch.where(
                new_fin,
                top_val[:, :k] / length_penalty_factor(float(n_tok), length_penalty),
                NEG_INF,
            )  # (b, K)
            src_rows = (torch.arange(b, device=device)[:, None] * kk + top_beam[:, :k]).view(-1)
            new_tokens = history.index_select(0, src_rows).view(b, k, step)  # (b, K, t)
            new_tokens = F.pad(new_tokens, (0, max_steps - step), value=PAD_ID)  # (b, K, L+1)
            all_score = torch.cat([fin_score[active], new_score], dim=1)  # (b, 2K)
            keep_score, keep = all_score.topk(k, dim=1)  # (b, K)
            all_logp = torch.cat([fin_logp[active], top_val[:, :k]], dim=1)  # (b, 2K)
            all_tokens = torch.cat([fin_tokens[active], new_tokens], dim=1)  # (b, 2K, L+1)
            new_len = torch.full((b, k), step, dtype=torch.long, device=device)
            all_len = torch.cat([fin_len[active], new_len], dim=1)  # (b, 2K)
            fin_score[active] = keep_score
            fin_logp[active] = all_logp.gather(1, keep)
            fin_len[active] = all_len.gather(1, keep)
            fin_tokens[active] = all_tokens.gather(1, keep[:, :, None].expand(-1, -1, max_steps))
        else:  # the buffers stay as they are (sorted best first)
            keep_score = fin_score[active]  # (b, K)

        # -- continue: the K best non-eos candidates (there are at least K among 2K).
        order = arange_2k + is_eos.long() * 2 * k  # eos candidates sort last
        live = order.topk(k, dim=1, largest=False).indices  # (b, K)
        scores = top_val.gather(1, live)  # (b, K)
        beam = top_beam.gather(1, live)  # (b, K)
        last = top_tok.gather(1, live).view(-1)  # (b*K,)
        reorder = (torch.arange(b, device=device)[:, None] * kk + beam).view(-1)  # (b*K,)
        history = torch.cat([history.index_select(0, reorder), last[:, None]], dim=1)
        state.reorder(reorder, cross=step == 0)  # then beams stay in their sentence

        # -- stop test: one host sync per step.
        n_done_fin = torch.isfinite(keep_score).sum(dim=1)  # (b,)
        best_live = scores.max(dim=1).values  # (b,)
        if length_penalty > 0:
            reachable = best_live / lp_max[active]
        else:  # lp shrinks or stays with length: the next step's lp is the most favourable
            reachable = best_live / length_penalty_factor(float(n_tok + 1), length_penalty)
        beaten = keep_score[:, n_best - 1] >= reachable  # (b,) False while < n_best finished
        done = (n_done_fin >= k) | beaten | budget[active].le(step) | ~torch.isfinite(best_live)
        n_done = int(done.sum())
        done_here = n_done == b  # then the rows stay, for the dummy steps of sync_steps
        if _stop(done_here, sync_steps, device):
            break
        if n_done and not done_here:
            keep_rows = (~done).nonzero().squeeze(1)  # (b',)
            active = active.index_select(0, keep_rows)
            scores = scores.index_select(0, keep_rows)
            beam_rows = (keep_rows[:, None] * k + torch.arange(k, device=device)).view(-1)
            history = history.index_select(0, beam_rows)
            last = last.index_select(0, beam_rows)
            state.reorder(beam_rows, cross=True)

    results: list[list[Hypothesis]] = []
    for i in range(bsz):
        hyps = []
        for j in range(n_best):
            s = float(fin_score[i, j])
            if s == NEG_INF:
                break
            n = int(fin_len[i, j])
            hyps.append(Hypothesis(fin_tokens[i, j, :n].tolist(), s, float(fin_logp[i, j])))
        results.append(hyps)
    return results
