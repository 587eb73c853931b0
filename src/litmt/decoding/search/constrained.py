"""Lexically constrained beam search with dynamic beam allocation (DBA).

Post & Vilar (2018), "Fast Lexically Constrained Decoding with Dynamic Beam Allocation", with
the bank ordering of Hu et al. (2019) as fairseq's ``--constraints`` uses it; written here
from the papers, for litmt's search conventions (`litmt.decoding.search.beam` module docstring:
budgets, GNMT scores, forced eos, prefixes).

Each sentence has a list of constraints, target id sequences that must appear in its output
(contiguously, anywhere, in any order; a phrase listed twice must appear twice; different
phrases may overlap: "roter Hund" and "Hund rennt" are both met by "roter Hund rennt"; a
phrase is also met by its glued form after „ ( l' ...: `litmt.decoding.search.constraint_tracker`).

Constraint state of a hypothesis (`litmt.decoding.search.constraint_tracker.Tracker`): per phrase,
its occurrences met and the length of each form's longest prefix that ends the hypothesis.
Its *bank* is the number of constraint tokens it has produced (0 .. C, C = all constraint
tokens of the sentence; C exactly when every constraint is met). The search runs with at
least C + 1 beams (`litmt.decoding.search.rules.constrained_beam`), one per bank.

One step, per sentence with K live beams:

1. Candidates: the 2K best (beam, token) continuations by cumulative log-probability (as in
   plain beam search), plus, for every live beam, its single best token and every token that
   advances one of its unmet constraints (its next token, or a constraint's first token).
2. eos is blocked (-inf) for a beam with an unmet constraint, except at the sentence's
   budget, where eos is forced as always. A finished hypothesis that has not met all its
   constraints (only possible at the budget) ranks below every one that has.
3. Finishing: an eos candidate finishes its hypothesis when its log-probability is among the
   K best candidates of the top bank (all constraints met; with no constraints that is every
   candidate, plain beam search's rule); at the budget every eos candidate finishes.
4. Dynamic beam allocation: the non-eos candidates are sorted by (bank, log-probability),
   each gets its rank within its bank, and the K live beams are taken by (rank, higher bank
   first): the best of every bank, then the second best of every bank, and so on. So
   hypotheses that have placed more constraint tokens keep a place in the beam although
   their log-probability is lower.
5. A sentence is done when its n_best-th finished score already beats the best live beam
   scored as if it finished at the next step, or at its budget: `beam_search`'s stop test
   (`litmt.decoding.search.beam_parts.beam_done`, ``constrained=True``: without its "K finished"
   rule, as hypotheses that met their constraints early and badly would fill the buffer
   before the good ones finish), over the same finished buffer (`FinishedBuffer`, its
   hypotheses that meet every constraint marked final).

Whole words (``words.continuation``, given by `Translator` from the target pieces): a
constraint is tokenised as a word sequence (``"Hund"`` is ``▁Hund``), but the model could
extend its last word ("Hund" + "e"). At the step after a hypothesis completes a constraint,
pieces that continue a word (no leading ``▁``, starting with a letter or digit) are blocked,
unless one of them advances another unmet constraint; so a constraint ends at a word end.

The budget of a constrained sentence is raised to hold its prefix and all its constraints
(`litmt.decoding.search.rules.budget_floor`), so the constraints can be met: DBA keeps beams in
the top banks, and eos stays blocked until they are met. `constrained_search` returns only the
hypotheses that meet them all, or, where none does (eos forced at the budget first), the best
one flagged ``constraints_met=False`` (`FinishedBuffer.best`).

The model runs batched (all live beams of all sentences in one `decode_step`); the candidate
bookkeeping is per sentence in Python (a few dozen candidates per sentence and step). It is
reached through `constrained_search`, which checks the
arguments and builds the step rules and the finished buffer.

Shapes: B sentences, b still active, K beam size, kk live beams per sentence (1 at the first
step), V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.beam import FinishedBuffer, beam_done, topk_rows, update_scores
from litmt.decoding.search.constraint_tracker import State, Tracker, WordPieces
from litmt.decoding.search.rules import NEG_INF, Hypothesis, StepModel, StepRules, check_search_args
from litmt.decoding.search.stopping import check_stop
from litmt.errors import ConfigError

Candidate = tuple[int, float, int, int, State]
"""A non-eos continuation: (bank, cumulative log-prob, beam, token, constraint state)."""


def check_constraint_ids(constraints: Sequence[Sequence[Sequence[int]]], n: int) -> None:
    """Refuse constraints that are not `n` lists of non-empty id sequences without bos, eos, pad.

    Raises:
        ConfigError: one line saying what is wrong.
    """
    if len(constraints) != n:
        raise ConfigError(f"{len(constraints)} constraint lists for {n} sentences")
    for phrases in constraints:
        for c in phrases:
            if len(c) == 0:
                raise ConfigError("a constraint must have at least one target token")
            if EOS_ID in c or BOS_ID in c or PAD_ID in c:
                raise ConfigError("a constraint must not contain bos, eos or pad")


@dataclass
class _Beams:
    """The live beams of the sentences still searched: kk rows each, row r = i * kk + j is
    beam j of the i-th sentence of `active` (b sentences, 1 row each at the first step)."""

    active: list[int]  # (b,) original sentence ids
    kk: int
    scores: Tensor  # (b*kk,) cumulative log-probs
    last: Tensor  # (b*kk,) each row's last token
    history: list[list[int]]  # per row, its tokens
    cstate: list[State]  # per row, its constraint state
    just_met: list[bool]  # per row, its last token completed a constraint


@torch.no_grad()
def constrained_search(
    model: StepModel,
    src: Tensor,
    constraints: Sequence[Sequence[Sequence[int]]],
    config: DecodeConfig,
    *,
    beam_size: int | None = None,
    sync_steps: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
    words: WordPieces | None = None,
) -> list[list[Hypothesis]]:
    """Lexically constrained beam search (module docstring) of a batch.

    Args:
        model: the model in eval mode (or an `Ensemble`).
        src: (B, S) source ids, right-padded with pad.
        constraints: B lists of target id sequences each output must contain (a list may be
            empty: plain beam search for that sentence).
        config: the length penalty, output budget, ``min_len`` and ``n_best``.
        beam_size: K (None: ``config.beam_size``); `litmt.decoding.search.rules.beam_groups`
            gives the K each sentence needs.
        sync_steps: refused (the constrained search steps each sentence apart).
        prefixes: B lists of target ids each output starts with; None = none.
        words: the target pieces that continue a word (blocked right after a constraint is
            completed) and the glued forms of the constraints (`WordPieces`); None = neither.

    Returns:
        For each source row, ``n_best`` hypotheses meeting every constraint, best first; a
        sentence where none does within its budget gives its best hypothesis,
        ``constraints_met=False``.
    """
    k = config.beam_size if beam_size is None else beam_size
    check_search_args(model, src, min_len=config.min_len, beam_size=k, n_best=config.n_best)
    check_constraint_ids(constraints, src.size(0))
    if sync_steps:
        raise ConfigError("constrained decoding does not support sync_steps")
    if src.size(0) == 0:
        return []
    budget = (config.max_len_a, config.max_len_b, config.min_len)
    rules = StepRules.build(model, src, *budget, prefixes, constraints)
    finished = FinishedBuffer(rules.budget, k, config.length_penalty, torch.float64)
    constrained_beam_search(model, src, constraints, rules, finished, config.n_best, words)
    return finished.best(config.n_best, final_only=True)


@torch.no_grad()
def constrained_beam_search(
    model: StepModel,
    src: Tensor,
    constraints: Sequence[Sequence[Sequence[int]]],
    rules: StepRules,
    finished: FinishedBuffer,
    n_best: int,
    words: WordPieces | None = None,
) -> None:
    """The constrained search's steps (module docstring), filling `finished`.

    `constrained_search` checks the arguments and builds `rules` and `finished` (K and alpha
    are the buffer's).

    Args:
        model: the model in eval mode (or an `Ensemble`).
        src: (B, S) source ids, right-padded with pad.
        constraints: B lists of constraints (target id lists, each non-empty; a list may be
            empty: plain beam search for that sentence).
        rules: the budgets (raised to hold prefix and constraints), min_len and prefixes.
        finished: the finished buffer, float64 (the bookkeeping's Python floats, exactly).
        n_best: for the stop test.
        words: the target pieces: those that continue a word, blocked right after a
            constraint is completed, and the glued forms (module docstring). None = neither.
    """
    bsz, device = src.size(0), src.device
    trackers = [Tracker(c, words) for c in constraints]
    budgets = rules.budget.tolist()
    cont = None if words is None else words.continuation.nonzero()[:, 0].to(device)  # (W,)
    memory, mask = model.encode(src)
    state = model.init_state(memory, mask, capacity=rules.steps)
    beams = _Beams(
        active=list(range(bsz)),
        kk=1,
        scores=torch.zeros(bsz, device=device),
        last=torch.full((bsz,), BOS_ID, dtype=torch.long, device=device),
        history=[[] for _ in range(bsz)],
        cstate=[tr.start for tr in trackers],
        just_met=[False] * bsz,
    )
    for step in range(rules.steps):
        check_stop(step)  # a caller that no longer waits (stop_when) ends the search here
        b, kk = len(beams.active), beams.kk
        sentences = torch.tensor(beams.active, device=device)  # (b,)
        at_budget = [budgets[s] <= step for s in beams.active]
        logp = F.log_softmax(model.decode_step(beams.last, state).float(), dim=-1)  # (b*kk, V)
        rules.apply(logp, step, sentences.repeat_interleave(kk))
        _block_eos(logp, beams, trackers, at_budget)
        if cont is not None and any(beams.just_met):
            _end_words(logp, beams, trackers, cont, rules, step)
        update_scores(logp, beams.scores.view(b, kk))  # logp (b*kk, V) now cumulative
        ends, lives = _split(_candidates(logp, beams, trackers, finished.k), beams, trackers)
        _finish(finished, ends, lives, beams, trackers, at_budget)
        chosen = [allocate(live, finished.k) for live in lives]
        best_live = [max((c[1] for c in ch), default=NEG_INF) for ch in chosen]
        done = beam_done(
            finished,
            sentences,
            torch.tensor(best_live, dtype=torch.float64, device=device),
            torch.tensor(at_budget, device=device),
            step,
            n_best,
            constrained=True,
        ).tolist()
        keep = [i for i in range(b) if not done[i]]
        if not keep:
            break
        reorder, beams = _advance(beams, chosen, keep, finished.k, trackers)
        state.reorder(reorder.to(device), cross=step == 0 or len(keep) < b)


def _block_eos(logp: Tensor, beams: _Beams, trackers: list[Tracker], at_budget: list[bool]) -> None:
    """In place on logp (b*kk, V): eos is -inf for a row with an unmet constraint, except at
    its sentence's budget."""
    kk = beams.kk
    blocked = [
        r
        for r in range(len(beams.cstate))
        if not at_budget[r // kk] and not trackers[beams.active[r // kk]].done(beams.cstate[r])
    ]
    if blocked:
        logp[torch.tensor(blocked, device=logp.device), EOS_ID] = NEG_INF


def _end_words(
    logp: Tensor,
    beams: _Beams,
    trackers: list[Tracker],
    words: Tensor,
    rules: StepRules,
    step: int,
) -> None:
    """In place on logp (b*kk, V): after a completed constraint the word ends: the pieces
    `words` (W,) that continue a word are -inf, unless one advances an unmet constraint
    (and not inside a forced prefix, which is forced as it is)."""
    kk = beams.kk
    in_prefix = [False] * len(beams.cstate)
    if rules.prefix is not None:
        rows = torch.tensor(beams.active, device=logp.device).repeat_interleave(kk)
        in_prefix = rules.prefix[1][rows].gt(step).tolist()
    for r in range(len(beams.cstate)):
        if not beams.just_met[r] or in_prefix[r]:
            continue
        keep = trackers[beams.active[r // kk]].wanted(beams.cstate[r])
        row = logp[r]  # (V,) a view
        saved = {t: float(row[t]) for t in keep}
        row.index_fill_(0, words, NEG_INF)
        for t, v in saved.items():
            row[t] = v


def _candidates(
    cand: Tensor, beams: _Beams, trackers: list[Tracker], k: int
) -> list[dict[tuple[int, int], float]]:
    """Per sentence, its candidates {(beam, token): cumulative log-prob} (finite only): the 2K
    best, and for every live beam its best token and every token that advances one of its
    unmet constraints (cand (b*kk, V) cumulative)."""
    b, kk = len(beams.active), beams.kk
    vocab = cand.size(-1)
    top_val, top_idx = topk_rows(cand.view(b, kk * vocab), 2 * k)  # (b, 2K)
    best_tok = cand.argmax(dim=-1).tolist()  # (b*kk,) each beam's best next token
    row_scores = beams.scores.tolist()
    extra_rows: list[int] = []
    extra_toks: list[int] = []
    for r in range(b * kk):
        if row_scores[r] == NEG_INF:
            continue
        toks = trackers[beams.active[r // kk]].wanted(beams.cstate[r])
        toks.add(best_tok[r])
        extra_rows.extend([r] * len(toks))
        extra_toks.extend(toks)
    extra_vals = cand[extra_rows, extra_toks].tolist() if extra_rows else []
    cands: list[dict[tuple[int, int], float]] = [{} for _ in range(b)]
    for i, (vals, idxs) in enumerate(zip(top_val.tolist(), top_idx.tolist(), strict=True)):
        for v, idx in zip(vals, idxs, strict=True):
            if v != NEG_INF:
                cands[i][divmod(idx, vocab)] = v
    for r, t, v in zip(extra_rows, extra_toks, extra_vals, strict=True):
        if v != NEG_INF:
            cands[r // kk][(r % kk, t)] = v
    return cands


def _split(
    cands: list[dict[tuple[int, int], float]], beams: _Beams, trackers: list[Tracker]
) -> tuple[list[list[tuple[float, int]]], list[list[Candidate]]]:
    """Per sentence, its eos candidates (log-prob, beam) and its non-eos ones (`Candidate`)."""
    ends: list[list[tuple[float, int]]] = []
    lives: list[list[Candidate]] = []
    for i, found in enumerate(cands):
        tr = trackers[beams.active[i]]
        ends.append([])
        lives.append([])
        for (j, t), v in found.items():
            r = i * beams.kk + j
            if t == EOS_ID:
                ends[i].append((v, j))
            else:
                ns = tr.advance(beams.cstate[r], t)
                lives[i].append((tr.bank(ns), v, j, t, ns))
    return ends, lives


def _finish(
    finished: FinishedBuffer,
    ends: list[list[tuple[float, int]]],
    lives: list[list[Candidate]],
    beams: _Beams,
    trackers: list[Tracker],
    at_budget: list[bool],
) -> None:
    """Add the eos candidates among the K best of their sentence's top bank (every one at the
    budget) to `finished`, final when they meet every constraint."""
    k, kk = finished.k, beams.kk
    picked: dict[int, list[tuple[float, int, bool]]] = {}  # sentence -> (log-prob, row, met)
    for i, sent_ends in enumerate(ends):
        if not sent_ends:
            continue
        tr = trackers[beams.active[i]]
        bar = NEG_INF
        if not at_budget[i]:
            top = [v for v, _ in sent_ends] + [v for bk, v, *_ in lives[i] if bk == tr.total]
            bar = sorted(top, reverse=True)[min(k, len(top)) - 1]
        rows = [i * kk + j for v, j in sent_ends if v >= bar]
        vals = [v for v, _ in sent_ends if v >= bar]
        picked[i] = [(v, r, tr.done(beams.cstate[r])) for v, r in zip(vals, rows, strict=True)]
    if not picked:
        return
    width = max(len(p) for p in picked.values())
    log_prob = torch.full((len(picked), width), NEG_INF, dtype=torch.float64)
    rows = torch.zeros((len(picked), width), dtype=torch.long)
    final = torch.zeros((len(picked), width), dtype=torch.bool)
    for n, found in enumerate(picked.values()):
        for c, (v, r, met) in enumerate(found):
            log_prob[n, c], rows[n, c], final[n, c] = v, r, met
    device = finished.score.device
    history = torch.tensor(beams.history, dtype=torch.long, device=device)  # (b*kk, t)
    sentences = torch.tensor([beams.active[i] for i in picked], device=device)
    finished.add(sentences, log_prob.to(device), history, rows.to(device), final.to(device))


def allocate(live: list[Candidate], k: int) -> list[Candidate]:
    """Dynamic beam allocation: the K candidates taken by (rank within their bank, higher bank
    first), ranks by log-probability: the best of every bank, then the second best, ..."""
    live = sorted(live, key=lambda c: (c[0], c[1]), reverse=True)
    ranked = []
    rank, prev_bank = 0, None
    for c in live:
        rank = rank + 1 if c[0] == prev_bank else 0
        prev_bank = c[0]
        ranked.append((rank, -c[0], -c[1], c))
    ranked.sort(key=lambda x: x[:3])
    return [x[3] for x in ranked[:k]]


def _advance(
    beams: _Beams, chosen: list[list[Candidate]], keep: list[int], k: int, trackers: list[Tracker]
) -> tuple[Tensor, _Beams]:
    """The K beams of each kept sentence (padded with dead copies of its best): the rows of the
    old layout they come from (b'*K,), and the new live beams."""
    rows: list[int] = []
    toks: list[int] = []
    scores: list[float] = []
    history: list[list[int]] = []
    cstate: list[State] = []
    just_met: list[bool] = []
    for i in keep:
        tr = trackers[beams.active[i]]
        picked = list(chosen[i])
        while len(picked) < k:  # pad with dead copies to keep K rows
            bank, _, j, t, ns = picked[0]
            picked.append((bank, NEG_INF, j, t, ns))
        for _, v, j, t, ns in picked:
            r = i * beams.kk + j
            rows.append(r)
            toks.append(t)
            scores.append(v)
            history.append([*beams.history[r], t])
            cstate.append(ns)
            just_met.append(tr.completed(beams.cstate[r], ns))
    device = beams.last.device
    new = _Beams(
        active=[beams.active[i] for i in keep],
        kk=k,
        scores=torch.tensor(scores, device=device),
        last=torch.tensor(toks, dtype=torch.long, device=device),
        history=history,
        cstate=cstate,
        just_met=just_met,
    )
    return torch.tensor(rows), new


__all__ = ["allocate", "check_constraint_ids", "constrained_beam_search", "constrained_search"]
