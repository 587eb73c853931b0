"""Greedy and batched beam search over `decode_step` (KV-cache decoding);
`litmt.decoding.dispatch.decode` is the one entry point that picks a search (and samples)
from a `DecodeConfig`.

The searches are sequences of named parts: the argument checks and the rules each step
applies (`litmt.decoding.search_rules`), and the parts of a beam step
(`litmt.decoding.beam_parts`: scores, top-k, the finished buffer, the stop test), which the
constrained search (`litmt.decoding.constraints`) shares.

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
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.beam_parts import (
    FinishedBuffer,
    beam_done,
    beam_rows,
    topk_rows,
    update_scores,
)
from litmt.decoding.config import DecodeConfig
from litmt.decoding.constraint_tracker import WordPieces
from litmt.decoding.constraints import check_constraint_ids, constrained_beam_search
from litmt.decoding.search_rules import (
    NEG_INF,
    Hypothesis,
    StepModel,
    StepRules,
    all_done,
    check_search_args,
    check_source,
    length_penalty_factor,
    loop_steps,
    output_budgets,
)
from litmt.errors import ConfigError

_D = DecodeConfig()  # the keyword defaults below are the project's one set

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
    """Decode `n` rows per source (R = B * n rows) one token at a time with `rule`; with the
    defaults (one row per source, the most likely token) this is greedy search
    (`greedy_search` is this function).

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
        R hypotheses, row r decoding source r // n (greedy: one per source, in input order).
    """
    check_search_args(model, src, min_len=min_len)
    bsz, device = src.size(0), src.device
    if bsz == 0:
        return []
    rules = StepRules.build(model, src, max_len_a, max_len_b, min_len, prefixes)
    rows = bsz * n
    sentence = torch.arange(bsz, device=device).repeat_interleave(n)  # (R,)
    steps = loop_steps(rules, sync_steps, device)
    memory, mask = model.encode(src)
    state = model.init_state(memory, mask, capacity=steps)
    if n > 1:
        state.reorder(sentence, cross=True)  # B -> R
    tokens = torch.full((rows,), BOS_ID, dtype=torch.long, device=device)  # (R,)
    out = torch.full((rows, rules.steps), PAD_ID, dtype=torch.long, device=device)  # (R, L)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # (R,)
    log_prob = torch.zeros(rows, dtype=torch.float32, device=device)  # (R,)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) incl. eos
    done_here = False
    for step in range(steps):
        if done_here:  # sync_steps only: another rank still decodes; match its collectives
            model.decode_step(tokens, state)
        else:
            logits = model.decode_step(tokens, state).float()  # (R, V)
            logp = F.log_softmax(logits, dim=-1)  # the model's distribution, for log_prob
            rules.apply(logp, step, sentence)
            tokens = rule(logits, logp).masked_fill(finished, PAD_ID)  # (R,)
            log_prob += logp.gather(1, tokens[:, None])[:, 0].masked_fill(finished, 0.0)
            lengths += (~finished).long()
            out[:, step] = tokens
            finished |= tokens.eq(EOS_ID)
            done_here = bool(finished.all())  # the one host sync per step
        if all_done(done_here, sync_steps, device):
            break
    score = log_prob / length_penalty_factor(lengths.float(), length_penalty)
    toks, lps, scs, lens = out.tolist(), log_prob.tolist(), score.tolist(), lengths.tolist()
    # row[: n - 1] drops eos and the padding after it
    return [Hypothesis(toks[r][: lens[r] - 1], scs[r], lps[r]) for r in range(rows)]


greedy_search = decode_rows
"""Batched greedy decoding: `decode_rows` with its defaults (one row per source, argmax)."""


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
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    words: WordPieces | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search with per-layer decode caches, GNMT length penalty and n-best output.

    Each step scores the K*V continuations of every sentence's K live beams, keeps the 2K
    best: eos candidates among the top K become finished hypotheses (kept, per sentence, in a
    device buffer of the K best by normalised score: `FinishedBuffer`), the K best non-eos
    candidates live on. A sentence is done by the stop test (`beam_done`: K finished, the
    n_best-th finished beats what any live beam can reach, or the budget); done sentences are
    dropped from the batch (cache rows included); the search ends when every sentence is done.

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
        sync_steps: every rank runs the same number of decoder steps (see module docstring);
            not with `constraints`.
        prefixes: B lists of target ids each output starts with (see module docstring); while
            a sentence is inside its prefix, only its best beam is alive (the others are -inf).
        constraints: B lists of target id sequences each output must contain: the lexically
            constrained search (`litmt.decoding.constraints`); None = none.
        words: with `constraints`, the target pieces that continue a word (blocked right
            after a constraint is completed) and the glued forms of the constraints
            (`litmt.decoding.constraint_tracker.WordPieces`); None = neither.

    Returns:
        For each source row, `n_best` hypotheses sorted by decreasing score. With
        constraints, only those meeting every constraint; a sentence where none does within
        its budget gives its best hypothesis, ``constraints_met=False``.
    """
    check_search_args(model, src, min_len=min_len, beam_size=beam_size, n_best=n_best)
    if constraints is not None:
        check_constraint_ids(constraints, src.size(0))
        if sync_steps:
            raise ConfigError("constrained decoding does not support sync_steps")
    if src.size(0) == 0:
        return []
    rules = StepRules.build(model, src, max_len_a, max_len_b, min_len, prefixes, constraints)
    if constraints is not None:
        finished = FinishedBuffer(rules.budget, beam_size, length_penalty, torch.float64)
        constrained_beam_search(model, src, constraints, rules, finished, n_best, words)
        return finished.best(n_best, final_only=True)
    finished = FinishedBuffer(rules.budget, beam_size, length_penalty)
    _beam_loop(model, src, rules, finished, n_best, sync_steps)
    return finished.best(n_best)


def _beam_loop(
    model: StepModel,
    src: Tensor,
    rules: StepRules,
    finished: FinishedBuffer,
    n_best: int,
    sync_steps: bool,
) -> None:
    """`beam_search`'s steps for src (B, S), into `finished` (its K and alpha are the search's)."""
    bsz, k, device = src.size(0), finished.k, src.device
    vocab = model.config.tgt_vocab_size
    steps = loop_steps(rules, sync_steps, device)
    memory, mask = model.encode(src)  # (B, S, C), (B, S)
    state = model.init_state(memory, mask, capacity=steps)  # one row per sentence first
    # Live state of the still-active sentences (b of them), `kk` rows (beams) each: one at
    # the first step, K after it.
    active = torch.arange(bsz, device=device)  # (b,) original ids
    scores = torch.zeros((bsz, 1), device=device)  # (b, kk) cumulative log-probs
    history = torch.empty((bsz, 0), dtype=torch.long, device=device)  # (b*kk, t)
    last = torch.full((bsz,), BOS_ID, dtype=torch.long, device=device)  # (b*kk,)
    arange_2k = torch.arange(2 * k, device=device)  # (2K,)
    done_here = False
    for step in range(steps):
        if done_here:  # sync_steps only: another rank still decodes; match its collectives
            model.decode_step(last, state)
            if all_done(True, sync_steps, device):
                break
            continue
        b, kk = active.numel(), scores.size(1)
        logp = F.log_softmax(model.decode_step(last, state).float(), dim=-1)  # (b*kk, V)
        rules.apply(logp, step, active.repeat_interleave(kk))
        top_val, top_idx = topk_rows(update_scores(logp, scores), 2 * k)  # (b, 2K)
        top_beam, top_tok = top_idx // vocab, top_idx % vocab  # (b, 2K)
        is_eos = top_tok.eq(EOS_ID)  # (b, 2K)
        # -- finish: eos candidates among the top K
        ends = torch.where(is_eos[:, :k], top_val[:, :k], NEG_INF)  # (b, K)
        local = torch.arange(b, device=device)  # (b,)
        finished.add(active, ends, history, beam_rows(local, kk, top_beam[:, :k]).view(b, k))
        # -- continue: the K best non-eos candidates (there are at least K among 2K)
        order = arange_2k + is_eos.long() * 2 * k  # eos candidates sort last
        live = order.topk(k, dim=1, largest=False).indices  # (b, K)
        scores = top_val.gather(1, live)  # (b, K)
        last = top_tok.gather(1, live).view(-1)  # (b*K,)
        reorder = beam_rows(local, kk, top_beam.gather(1, live))  # (b*K,)
        history = torch.cat([history.index_select(0, reorder), last[:, None]], dim=1)
        state.reorder(reorder, cross=step == 0)  # then beams stay in their sentence
        # -- stop test: one host sync per step
        best_live = scores.max(dim=1).values  # (b,)
        done = beam_done(finished, active, best_live, rules.budget[active].le(step), step, n_best)
        n_done = int(done.sum())
        done_here = n_done == b  # then the rows stay, for the dummy steps of sync_steps
        if all_done(done_here, sync_steps, device):
            break
        if n_done and not done_here:
            keep = (~done).nonzero().squeeze(1)  # (b',)
            active, scores = active.index_select(0, keep), scores.index_select(0, keep)
            rows = beam_rows(keep, k, torch.arange(k, device=device).expand(keep.numel(), k))
            history, last = history.index_select(0, rows), last.index_select(0, rows)
            state.reorder(rows, cross=True)


__all__ = [
    "NEG_INF",
    "Hypothesis",
    "StepModel",
    "TokenRule",
    "beam_search",
    "check_source",
    "decode_rows",
    "greedy_search",
    "length_penalty_factor",
    "output_budgets",
    "shared_limits",
    "topk_rows",
]
