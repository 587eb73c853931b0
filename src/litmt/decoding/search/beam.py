"""Batched beam search over `decode_step` (KV-cache decoding), with the named parts of a beam
step beside the loop (`_beam_loop`), each unit-tested on its own
(``tests/unit/decoding/search/test_beam_parts.py``) and shared with the constrained search
(`litmt.decoding.search.constrained`):

- `update_scores`: a step's log-probabilities plus each beam's cumulative score;
- `topk_rows`: the 2K best (beam, token) continuations of each sentence;
- `FinishedBuffer`: per sentence, the K best finished hypotheses by GNMT score, and whether
  it is full or its n_best-th already beats every live beam;
- `beam_done`: the stop test of a sentence;
- `beam_rows`: the decoder-state rows that carry the chosen beams to the next step.

The rules every search keeps (scores, budgets, ``min_len``, prefixes, ``sync_steps``) are
written once in `litmt.decoding.search.rules`; `litmt.decoding.search.dispatch.decode` picks a
search from a `DecodeConfig`.

Shapes: B sentences, b of them still searched, K beam size, kk live beams per sentence (1 at
the first step), C candidates per sentence, S source length, t tokens generated so far,
L the longest budget + 1, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.rules import (
    NEG_INF,
    Hypothesis,
    StepModel,
    StepRules,
    all_done,
    check_search_args,
    length_penalty_factor,
    loop_steps,
)
from litmt.decoding.search.stopping import check_stop

_D = DecodeConfig()  # the keyword defaults below are the project's one set


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
        min_len: no eos before this many tokens (`litmt.decoding.search.rules`).
        sync_steps: every rank runs the same number of decoder steps (`litmt.decoding.search.rules`).
        prefixes: B lists of target ids each output starts with (`litmt.decoding.search.rules`);
            while a sentence is inside its prefix, only its best beam is alive (the others are
            -inf).

    Returns:
        For each source row, `n_best` hypotheses sorted by decreasing score. Terminology
        constraints are `litmt.decoding.search.constrained.constrained_search`'s.
    """
    check_search_args(model, src, min_len=min_len, beam_size=beam_size, n_best=n_best)
    if src.size(0) == 0:
        return []
    rules = StepRules.build(model, src, max_len_a, max_len_b, min_len, prefixes)
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
        check_stop(step)  # a caller that no longer waits (stop_when) ends the search here
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


def update_scores(logp: Tensor, scores: Tensor) -> Tensor:
    """In place: each candidate's cumulative log-probability.

    Args:
        logp: (b*kk, V) the step's log-probabilities (-inf where a rule forbids).
        scores: (b, kk) each live beam's cumulative log-probability.

    Returns:
        (b, kk*V), a view of `logp`: candidate (j, token) of sentence i at j * V + token.
    """
    b, kk = scores.shape
    vocab = logp.size(-1)
    return logp.view(b, kk, vocab).add_(scores[:, :, None]).view(b, kk * vocab)


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


class FinishedBuffer:
    """Per sentence, the K best finished hypotheses, best first, kept on the device.

    A hypothesis of t tokens (eos excluded) with log-probability log P ranks by its GNMT
    score log P / lp(t + 1). A hypothesis may be marked not *final* (a constrained one that
    missed a constraint, finished only because its budget forced eos): it ranks below every
    final one, and only final ones count for `full` and `beats`. Ties keep the order of
    arrival (the buffer's own first).

    Args:
        budget: (B,) each sentence's output budget (`StepRules.budget`).
        k: K, hypotheses kept per sentence.
        alpha: the length penalty.
        dtype: of the scores (float64 keeps a search's float64 arithmetic exact).

    Attributes:
        score, log_prob: (B, K); -inf marks an empty slot.
        length: (B, K) tokens, eos excluded. tokens: (B, K, L), pad after `length`.
        final: (B, K) bool. lp_max: (B,) lp(budget + 1), the largest lp a sentence reaches.
    """

    def __init__(
        self, budget: Tensor, k: int, alpha: float, dtype: torch.dtype = torch.float32
    ) -> None:
        bsz, device = budget.numel(), budget.device
        self.k, self.alpha, self.width = k, alpha, int(budget.max()) + 1
        self.score = torch.full((bsz, k), NEG_INF, dtype=dtype, device=device)
        self.log_prob = torch.full((bsz, k), NEG_INF, dtype=dtype, device=device)
        self.length = torch.zeros((bsz, k), dtype=torch.long, device=device)
        self.tokens = torch.full((bsz, k, self.width), PAD_ID, dtype=torch.long, device=device)
        self.final = torch.zeros((bsz, k), dtype=torch.bool, device=device)
        self.lp_max = length_penalty_factor(budget.double() + 1, alpha).to(dtype)  # (B,)

    def add(
        self,
        sentences: Tensor,
        log_prob: Tensor,
        history: Tensor,
        rows: Tensor,
        final: Tensor | None = None,
    ) -> None:
        """Merge candidates into the buffers of `sentences`, keeping the K best of each.

        Args:
            sentences: (b,) the sentences (their ids in the buffer).
            log_prob: (b, C) each candidate's log P (tokens + eos); -inf = no candidate.
            history: (R, t) the tokens of the live rows, eos excluded.
            rows: (b, C) the row of `history` each candidate ends.
            final: (b, C) bool, None = every candidate is final.
        """
        score = log_prob / length_penalty_factor(float(history.size(1) + 1), self.alpha)
        finite = torch.isfinite(score)  # (b, C)
        # On CPU skip the merge when nothing finishes (most steps); on a GPU always merge
        # rather than add a host sync.
        if score.device.type == "cpu" and not bool(finite.any()):
            return
        b, c = rows.shape
        t = history.size(1)
        tokens = history.index_select(0, rows.view(-1)).view(b, c, t)  # (b, C, t)
        tokens = F.pad(tokens, (0, self.width - t), value=PAD_ID)  # (b, C, L)
        final = finite if final is None else final & finite
        all_score = torch.cat([self.score[sentences], score.to(self.score.dtype)], dim=1)
        all_final = torch.cat([self.final[sentences], final], dim=1)  # (b, K + C)
        # best first: by score, then final before not final (two stable sorts)
        order = all_score.sort(dim=1, descending=True, stable=True).indices  # (b, K + C)
        by_final = all_final.gather(1, order).sort(dim=1, descending=True, stable=True)
        keep = order.gather(1, by_final.indices)[:, : self.k]  # (b, K)
        all_logp = torch.cat([self.log_prob[sentences], log_prob.to(self.log_prob.dtype)], 1)
        all_len = torch.cat([self.length[sentences], torch.full_like(rows, t)], dim=1)
        all_tokens = torch.cat([self.tokens[sentences], tokens], dim=1)  # (b, K + C, L)
        self.score[sentences] = all_score.gather(1, keep)
        self.final[sentences] = all_final.gather(1, keep)
        self.log_prob[sentences] = all_logp.gather(1, keep)
        self.length[sentences] = all_len.gather(1, keep)
        self.tokens[sentences] = all_tokens.gather(1, keep[:, :, None].expand(-1, -1, self.width))

    def full(self, sentences: Tensor) -> Tensor:
        """(b,) bool: K final hypotheses."""
        return self.final[sentences].sum(dim=1).ge(self.k)

    def beats(self, sentences: Tensor, reachable: Tensor, n_best: int) -> Tensor:
        """(b,) bool: the n_best-th final hypothesis scores at least `reachable` (b,)."""
        enough = self.final[sentences].sum(dim=1).ge(n_best)
        return enough & self.score[sentences, n_best - 1].ge(reachable)

    def best(self, n_best: int, final_only: bool = False) -> list[list[Hypothesis]]:
        """Per sentence, its `n_best` best hypotheses (fewer if fewer finished), best first.

        With `final_only` (the constrained search): only final ones (meeting every
        constraint); a sentence with none gives its best one, ``constraints_met=False``.
        """
        score, log_prob = self.score.tolist(), self.log_prob.tolist()
        length, final = self.length.tolist(), self.final.tolist()
        results: list[list[Hypothesis]] = []
        for i in range(len(score)):
            n = sum(1 for s in score[i][:n_best] if s != NEG_INF)
            if final_only:  # the final ones come first (`add`)
                n = min(n, sum(final[i])) or min(n, 1)
            tokens = self.tokens[i, :n].tolist()
            results.append(
                [
                    Hypothesis(
                        tokens[j][: length[i][j]],
                        score[i][j],
                        log_prob[i][j],
                        constraints_met=final[i][j] or not final_only,
                    )
                    for j in range(n)
                ]
            )
        return results


def beam_done(
    finished: FinishedBuffer,
    sentences: Tensor,
    best_live: Tensor,
    at_budget: Tensor,
    step: int,
    n_best: int,
    constrained: bool = False,
) -> Tensor:
    """The stop test: (b,) bool, which of `sentences` (b,) are done after `step`.

    A sentence is done when (a) it has K final hypotheses (the rule fairseq uses; it makes
    K = 1 identical to greedy), or (b) its n_best-th final score already beats the best score
    any live beam could still reach (its log-probability can only fall, and lp grows at most
    to lp(budget + 1) when alpha > 0; with alpha <= 0 the next step's lp is the most
    favourable), or (c) it reached its budget (`at_budget` (b,)), or (d) it has no live beam
    (`best_live` (b,), the best live cumulative log-probability, is -inf).

    `constrained` (the constrained search): no rule (a), as hypotheses that met their
    constraints early and badly can fill the buffer before the good ones finish; in (b) a
    live beam is scored as if it finished at the next step, whatever alpha: the beams of
    the lower banks, fluent but without their constraints, would otherwise keep a sentence
    going to its budget.
    """
    if finished.alpha > 0 and not constrained:
        reachable = best_live / finished.lp_max[sentences]
    else:
        reachable = best_live / length_penalty_factor(float(step + 2), finished.alpha)
    done = finished.beats(sentences, reachable, n_best) | at_budget | ~torch.isfinite(best_live)
    return done if constrained else done | finished.full(sentences)


def beam_rows(sentences: Tensor, kk: int, beams: Tensor) -> Tensor:
    """(b'*K,) the decoder-state rows of beams (b', K) of `sentences` (b',), in a layout of kk
    rows per sentence (row i * kk + j is beam j of local sentence i)."""
    return (sentences[:, None] * kk + beams).view(-1)


__all__ = ["FinishedBuffer", "beam_done", "beam_rows", "beam_search", "topk_rows", "update_scores"]
