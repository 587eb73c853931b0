"""Lexically constrained beam search with dynamic beam allocation (DBA).

Post & Vilar (2018), "Fast Lexically Constrained Decoding with Dynamic Beam Allocation", with
the bank ordering of Hu et al. (2019) as fairseq's ``--constraints`` uses it; written here
from the papers, for litmt's search conventions (`litmt.decoding.search` module docstring:
budgets, GNMT scores, forced eos, prefixes).

Each sentence has a list of constraints, target id sequences that must appear in its output
(contiguously, anywhere, in any order; they may overlap: "roter Hund" and "Hund rennt" are
both met by "roter Hund rennt").

Constraint state of a hypothesis (`Tracker`): per constraint, met (-1) or the length of its
longest prefix that ends the hypothesis (a KMP automaton per constraint, so a failed partial
match falls back to the longest prefix that still fits, and an overlap is tracked by every
constraint it touches). Its *bank* is the number of constraint tokens it has produced: the
lengths of the met constraints plus the longest partial match among the others (0 .. C, C =
all constraint tokens of the sentence; C exactly when every constraint is met).

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
5. A sentence is done when K hypotheses have finished, when its n_best-th finished score
   already beats what any live beam can reach (as in `beam_search`), or at its budget.

Whole words (``word_continuation``, given by `Translator` from the target pieces): a
constraint is tokenised as a word sequence (``"Hund"`` is ``▁Hund``), but the model could
extend its last word ("Hund" + "e"). At the step after a hypothesis completes a constraint,
pieces that continue a word (no leading ``▁``, starting with a letter or digit) are blocked,
unless one of them advances another unmet constraint; so a constraint ends at a word end.

The budget of a constrained sentence is raised to hold its prefix and all its constraints
(`litmt.decoding.steering.budget_floor`), so the constraints can always be met: DBA keeps
beams in the top banks, and eos stays blocked until they are met.

The model runs batched (all live beams of all sentences in one `decode_step`); the candidate
bookkeeping is per sentence in Python (a few dozen candidates per sentence and step).

Shapes: B sentences, b still active, K beam size, kk live beams per sentence (1 at the first
step), V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search import (
    NEG_INF,
    Hypothesis,
    StepModel,
    check_source,
    constrain_eos,
    force_prefix,
    length_penalty_factor,
    output_budgets,
    prefix_table,
    topk_rows,
)
from litmt.decoding.steering import budget_floor
from litmt.errors import ConfigError

_D = DecodeConfig()
MET = -1  # the state of a met constraint

State = tuple[int, ...]  # per constraint: MET or its matched prefix length


class Tracker:
    """The constraints of one sentence and the automaton that tracks them.

    Args:
        constraints: target id sequences (each non-empty).
    """

    def __init__(self, constraints: Sequence[Sequence[int]]) -> None:
        self.phrases = [tuple(c) for c in constraints]
        self.total = sum(len(c) for c in self.phrases)  # C: the top bank
        self.start: State = tuple(0 for _ in self.phrases)
        self._next: dict[
            tuple[int, int, int], int
        ] = {}  # (constraint, progress, token) -> progress

    def _step(self, c: int, progress: int, token: int) -> int:
        """KMP transition: the longest prefix of constraint `c` ending the hypothesis after
        `token`, given that its `progress` first tokens ended it before."""
        key = (c, progress, token)
        found = self._next.get(key)
        if found is None:
            phrase = self.phrases[c]
            seq = (*phrase[:progress], token)
            found = 0
            for k in range(min(len(seq), len(phrase)), 0, -1):
                if seq[len(seq) - k :] == phrase[:k]:
                    found = k
                    break
            self._next[key] = found
        return found

    def advance(self, state: State, token: int) -> State:
        """The state after appending `token`."""
        out = []
        for c, progress in enumerate(state):
            if progress == MET:
                out.append(MET)
                continue
            k = self._step(c, progress, token)
            out.append(MET if k == len(self.phrases[c]) else k)
        return tuple(out)

    def bank(self, state: State) -> int:
        """Constraint tokens produced: the met constraints' lengths plus the longest partial
        match of the others (the max, not the sum: one token that starts two constraints,
        such as a lone ``▁``, is one token of progress, not two)."""
        met = sum(len(p) for p, s in zip(self.phrases, state, strict=True) if s == MET)
        return met + max((s for s in state if s != MET), default=0)

    def done(self, state: State) -> bool:
        """Every constraint is met."""
        return all(s == MET for s in state)

    def wanted(self, state: State) -> set[int]:
        """Tokens that advance an unmet constraint: its next token, or its first."""
        out = set()
        for p, s in zip(self.phrases, state, strict=True):
            if s != MET:
                out.add(p[s])
                out.add(p[0])
        return out


@torch.no_grad()
def constrained_beam_search(
    model: StepModel,
    src: Tensor,
    constraints: Sequence[Sequence[Sequence[int]]],
    *,
    beam_size: int = _D.beam_size,
    length_penalty: float = _D.length_penalty,
    max_len_a: float = _D.max_len_a,
    max_len_b: int = _D.max_len_b,
    n_best: int = _D.n_best,
    min_len: int = _D.min_len,
    prefixes: Sequence[Sequence[int]] | None = None,
    word_continuation: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Beam search whose outputs contain every constraint of their sentence (module docstring).

    Args:
        model: the model in eval mode (or an `Ensemble`).
        src: (B, S) source ids, right-padded with pad.
        constraints: B lists of constraints (target id lists, each non-empty; a list may be
            empty: plain beam search for that sentence).
        beam_size: K (1 works: the top bank then always wins the one place).
        length_penalty, max_len_a, max_len_b, n_best, min_len: as `beam_search`.
        prefixes: B lists of target ids each output starts with; None = none.
        word_continuation: (V,) bool, the target pieces that continue a word; blocked right
            after a constraint is completed (module docstring). None = no such rule.

    Returns:
        For each source row, up to `n_best` hypotheses: those meeting every constraint first,
        each group by decreasing score.
    """
    check_source(model, src)
    if beam_size < 1:
        raise ConfigError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ConfigError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    bsz, k, device = src.size(0), beam_size, src.device
    if len(constraints) != bsz:
        raise ConfigError(f"{len(constraints)} constraint lists for {bsz} sentences")
    if bsz == 0:
        return []
    cfg = model.config
    vocab = cfg.tgt_vocab_size
    if 2 * k > vocab:
        raise ConfigError(f"beam_size={k} is too large for a target vocabulary of {vocab}")
    for phrases in constraints:
        for c in phrases:
            if len(c) == 0:
                raise ConfigError("a constraint must have at least one target token")
            if EOS_ID in c or BOS_ID in c or PAD_ID in c:
                raise ConfigError("a constraint must not contain bos, eos or pad")
    trackers = [Tracker(c) for c in constraints]
    floor = budget_floor(cfg.max_positions, prefixes, constraints)
    budgets = output_budgets(
        src.ne(PAD_ID).sum(1).cpu(), max_len_a, max_len_b, cfg.max_positions, floor
    ).tolist()
    forced = None if prefixes is None else prefix_table(prefixes, device)  # (B, P), (B,)
    steps = max(budgets) + 1
    lp_max = [float(length_penalty_factor(n + 1.0, length_penalty)) for n in budgets]
    force_steps = set(budgets)

    memory, mask = model.encode(src)
    state = model.init_state(memory, mask, capacity=steps)

    active = list(range(bsz))  # original ids of the sentences still searched
    kk = 1
    scores = torch.zeros(bsz, device=device)  # (b*kk,) cumulative log-probs
    last = torch.full((bsz,), BOS_ID, dtype=torch.long, device=device)  # (b*kk,)
    history: list[list[int]] = [[] for _ in range(bsz)]  # per row
    cstate: list[State] = [trackers[i].start for i in range(bsz)]  # per row
    just_met = [False] * bsz  # per row: its last token completed a constraint
    if word_continuation is not None:
        continuation_ids = word_continuation.nonzero().squeeze(1).to(device)  # (W,)
    finished: list[list[tuple[bool, float, float, list[int]]]] = [[] for _ in range(bsz)]

    for step in range(steps):
        b = len(active)
        logp = F.log_softmax(model.decode_step(last, state).float(), dim=-1)  # (b*kk, V)
        row_sent = torch.tensor(active, device=device).repeat_interleave(kk)  # (b*kk,)
        at_budget = [budgets[s] <= step for s in active]
        if step in force_steps:
            rows_budget = torch.tensor([budgets[s] for s in active], device=device)
            constrain_eos(logp, step, min_len, EOS_ID, rows_budget.repeat_interleave(kk))
        else:
            constrain_eos(logp, step, min_len, EOS_ID, None)
        if forced is not None and step < forced[0].size(1):
            force_prefix(logp, step, forced[0][row_sent], forced[1][row_sent])
        blocked = [
            r
            for r in range(b * kk)
            if not at_budget[r // kk] and not trackers[active[r // kk]].done(cstate[r])
        ]
        if blocked:
            logp[torch.tensor(blocked, device=device), EOS_ID] = NEG_INF
        if word_continuation is not None and any(just_met):
            in_prefix = [False] * (b * kk)
            if forced is not None:  # a prefix is forced as it is, word ends or not
                in_prefix = forced[1][row_sent].gt(step).tolist()
            for r in (r for r in range(b * kk) if just_met[r] and not in_prefix[r]):
                keep = trackers[active[r // kk]].wanted(cstate[r])
                row = logp[r]  # (V,) a view: the word must end here
                saved = {t: float(row[t]) for t in keep}
                row.index_fill_(0, continuation_ids, NEG_INF)
                for t, v in saved.items():
                    row[t] = v
        cand = logp.add_(scores[:, None])  # (b*kk, V) cumulative
        top_val, top_idx = topk_rows(cand.view(b, kk * vocab), 2 * k)  # (b, 2K)
        best_tok = cand.argmax(dim=-1).tolist()  # (b*kk,) each beam's best next token
        row_scores = scores.tolist()
        extra_rows: list[int] = []
        extra_toks: list[int] = []
        for r in range(b * kk):
            if row_scores[r] == NEG_INF:
                continue
            toks = trackers[active[r // kk]].wanted(cstate[r])
            toks.add(best_tok[r])
            extra_rows.extend([r] * len(toks))
            extra_toks.extend(toks)
        extra_vals = cand[extra_rows, extra_toks].tolist() if extra_rows else []
        top_val_l, top_idx_l = top_val.tolist(), top_idx.tolist()

        cands: list[dict[tuple[int, int], float]] = [{} for _ in range(b)]
        for i in range(b):
            for v, idx in zip(top_val_l[i], top_idx_l[i], strict=True):
                if v != NEG_INF:
                    cands[i][divmod(idx, vocab)] = v
        for r, t, v in zip(extra_rows, extra_toks, extra_vals, strict=True):
            if v != NEG_INF:
                cands[r // kk][(r % kk, t)] = v

        new_rows: list[int] = []  # per kept sentence: K source rows (local b*kk indexing)
        new_toks: list[int] = []
        new_scores: list[float] = []
        new_hist: list[list[int]] = []
        new_state: list[State] = []
        new_met: list[bool] = []
        keep: list[int] = []  # local indices of sentences still searched
        n_tok = step + 1
        lp_now = float(length_penalty_factor(float(n_tok), length_penalty))
        for i in range(b):
            sent = active[i]
            tr = trackers[sent]
            live = []  # (bank, log-prob, beam, token, state)
            ends = []  # (log-prob, beam)
            for (j, t), v in cands[i].items():
                r = i * kk + j
                if t == EOS_ID:
                    ends.append((v, j))
                else:
                    ns = tr.advance(cstate[r], t)
                    live.append((tr.bank(ns), v, j, t, ns))
            # -- finish: eos candidates among the K best of the top bank (all at the budget)
            if ends:
                if at_budget[i]:
                    bar = NEG_INF
                else:
                    top_bank = sorted(
                        [v for v, _ in ends] + [v for bk, v, *_ in live if bk == tr.total],
                        reverse=True,
                    )
                    bar = top_bank[min(k, len(top_bank)) - 1]
                for v, j in ends:
                    if v >= bar:
                        r = i * kk + j
                        met = tr.done(cstate[r])
                        finished[sent].append((met, v / lp_now, v, list(history[r])))
                finished[sent].sort(key=lambda f: (f[0], f[1]), reverse=True)
                del finished[sent][k:]
            # -- continue: dynamic beam allocation over the banks
            live.sort(key=lambda c: (c[0], c[1]), reverse=True)
            ranked = []
            rank, prev_bank = 0, None
            for c in live:
                rank = rank + 1 if c[0] == prev_bank else 0
                prev_bank = c[0]
                ranked.append((rank, -c[0], -c[1], c))
            ranked.sort(key=lambda x: x[:3])
            chosen = [x[3] for x in ranked[:k]]
            # -- stop test
            fin = finished[sent]
            n_met = sum(1 for f in fin if f[0])
            best_live = max((c[1] for c in chosen), default=NEG_INF)
            if length_penalty > 0:
                reachable = best_live / lp_max[sent]
            else:
                reachable = best_live / float(length_penalty_factor(n_tok + 1.0, length_penalty))
            beaten = n_met >= n_best and fin[n_best - 1][1] >= reachable
            if n_met >= k or beaten or at_budget[i] or best_live == NEG_INF:
                continue
            keep.append(i)
            while len(chosen) < k:  # pad with dead copies to keep K rows
                bank, _, j, t, ns = chosen[0]
                chosen.append((bank, NEG_INF, j, t, ns))
            for _, v, j, t, ns in chosen:
                r = i * kk + j
                new_rows.append(r)
                new_toks.append(t)
                new_scores.append(v)
                new_hist.append([*history[r], t])
                new_state.append(ns)
                new_met.append(ns.count(MET) > cstate[r].count(MET))
        if not keep:
            break
        reorder = torch.tensor(new_rows, device=device)  # (b'*K,) rows of the old layout
        state.reorder(reorder, cross=step == 0 or len(keep) < b)
        active = [active[i] for i in keep]
        kk = k
        scores = torch.tensor(new_scores, device=device)
        last = torch.tensor(new_toks, dtype=torch.long, device=device)
        history, cstate, just_met = new_hist, new_state, new_met

    return [
        [Hypothesis(tokens, score, log_prob) for _, score, log_prob, tokens in fin[:n_best]]
        for fin in finished
    ]


__all__ = ["Tracker", "constrained_beam_search"]
