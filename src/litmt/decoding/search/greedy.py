"""Token-by-token search: greedy search and ancestral sampling, one loop (`decode_rows`) with
a rule that picks each row's next token: the most likely one (`greedy_search`) or a draw
from the tempered, top-k/top-p filtered distribution (`sample_search`, for back-translation
and n samples per source, drawn with a ``torch.Generator`` seeded with ``seed``).

The rules every search keeps (budgets, ``min_len``, prefixes, ``sync_steps``) are
`litmt.decoding.search.rules`'s.

Shapes: B sentences, N rows (samples) per sentence, R = B*N rows decoded token by token,
S source length, V target vocabulary, L longest allowed hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
    shared_limits,
)
from litmt.decoding.search.stopping import check_stop

_D = DecodeConfig()  # the keyword defaults below are the project's one set

TokenRule = Callable[[Tensor, Tensor], Tensor]
"""``rule(logits, logp) -> tokens``: the next token (R,) of each row from the step's logits
(R, V) and their log-softmax under the length constraints (R, V) (-inf where forbidden)."""


def _argmax(logits: Tensor, logp: Tensor) -> Tensor:
    return logp.argmax(dim=-1)  # (R,)


# When at least this share of a greedy search's live rows have finished (emitted eos), the
# search drops them from the decoder state (its ``reorder``, as beam search drops beams): a
# finished row would otherwise run every step until the batch's last row ends. Greedy only (the
# argmax rule, without sync_steps): a sampling rule draws for every row it is given, so
# dropping rows would change what a seed draws. On all of test2016 (recipe model, 2 threads,
# translate path) it took 22-28 % off engine=torch's greedy and 19-31 % off engine=onnx's,
# with identical outputs; notebook 2026-12-05, "ONNX format 6".
DROP_FINISHED_SHARE = 0.25


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
    every row has emitted eos; greedy search drops finished rows from the state on the way
    (`DROP_FINISHED_SHARE`). A hypothesis's ``log_prob`` is the model's own log-probability
    of its tokens, ``score`` its GNMT normalisation.

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
    drop = rule is _argmax and not sync_steps  # drop finished rows (DROP_FINISHED_SHARE)
    live = torch.arange(rows, device=device)  # (R',) the rows still in the state
    tokens = torch.full((rows,), BOS_ID, dtype=torch.long, device=device)  # (R',)
    out = torch.full((rows, rules.steps), PAD_ID, dtype=torch.long, device=device)  # (R, L)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # (R',)
    log_prob = torch.zeros(rows, dtype=torch.float32, device=device)  # (R,)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) incl. eos
    done_here = False
    for step in range(steps):
        check_stop(step)  # a caller that no longer waits (stop_when) ends the search here
        if done_here:  # sync_steps only: another rank still decodes; match its collectives
            model.decode_step(tokens, state)
        else:
            logits = model.decode_step(tokens, state).float()  # (R', V)
            logp = F.log_softmax(logits, dim=-1)  # the model's distribution, for log_prob
            rules.apply(logp, step, sentence[live])
            tokens = rule(logits, logp).masked_fill(finished, PAD_ID)  # (R',)
            log_prob[live] += logp.gather(1, tokens[:, None])[:, 0].masked_fill(finished, 0.0)
            lengths[live] += (~finished).long()
            out[live, step] = tokens
            finished |= tokens.eq(EOS_ID)
            done = int(finished.sum())  # the one host sync per step
            done_here = done == finished.numel()
            if drop and not done_here and done >= DROP_FINISHED_SHARE * finished.numel():
                keep = (~finished).nonzero()[:, 0]  # (R'',) positions among the live rows
                state.reorder(keep, cross=True)
                live, tokens, finished = live[keep], tokens[keep], finished[keep]
        if all_done(done_here, sync_steps, device):
            break
    score = log_prob / length_penalty_factor(lengths.float(), length_penalty)
    toks, lps, scs, lens = out.tolist(), log_prob.tolist(), score.tolist(), lengths.tolist()
    # row[: n - 1] drops eos and the padding after it
    return [Hypothesis(toks[r][: lens[r] - 1], scs[r], lps[r]) for r in range(rows)]


greedy_search = decode_rows
"""Batched greedy decoding: `decode_rows` with its defaults (one row per source, argmax)."""


def make_generator(config: DecodeConfig, device: torch.device) -> torch.Generator | None:
    """A generator on `device` seeded with ``config.seed`` (None: torch's global one)."""
    if config.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(config.seed))


@torch.no_grad()
def filter_logits(logits: Tensor, top_k: int = _D.top_k, top_p: float = _D.top_p) -> Tensor:
    """Set to -inf every token outside the top-k and outside the top-p nucleus (out of place).

    Args:
        logits: (R, V) scores (log-probabilities or logits; only their order and softmax
            matter).
        top_k: keep the k largest per row (0 = all).
        top_p: keep, per row, the most likely tokens up to the first one whose cumulative
            probability reaches `top_p` (that token included, so at least one is kept);
            1.0 = all.

    Returns:
        (R, V)
    """
    out = logits.clone()
    vocab = out.size(-1)
    if 0 < top_k < vocab:
        kth = out.topk(top_k, dim=-1).values[:, -1:]  # (R, 1) the k-th largest
        out.masked_fill_(out < kth, NEG_INF)
    if top_p < 1.0:
        sorted_logits, order = out.sort(dim=-1, descending=True)  # (R, V)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # (R, V) mass of the more likely tokens
        drop_sorted = before >= top_p  # the first token has 0 before it: always kept
        drop = drop_sorted.scatter(1, order, drop_sorted)  # back to vocabulary order
        out.masked_fill_(drop, NEG_INF)
    return out


@torch.no_grad()
def sample_search(
    model: StepModel,
    src: Tensor,
    config: DecodeConfig,
    *,
    generator: torch.Generator | None = None,
    sync_steps: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Ancestral sampling: ``config.n_best`` independent samples per source, batched (B * N
    rows).

    The encoder runs once per source; its state is fanned out to N rows. Each step draws
    from softmax(logits / temperature) restricted by `filter_logits`; temperature 0 takes the
    argmax. The length budget and `min_len` act as in the searches. The reported
    ``log_prob`` is the model's own log-probability of the sample (temperature 1, no
    cut: the number `litmt.decoding.analysis.forced` gives for the same pair), ``score`` its GNMT
    normalisation.

    Args:
        model: a model in eval mode or an `Ensemble`.
        src: (B, S) source ids, right-padded.
        config: n_best (samples per source), temperature, top_k, top_p, and the length
            settings (max_len_a, max_len_b, length_penalty, min_len).
        generator: random generator on src's device (None: torch's global one).
        sync_steps: every rank runs the same number of decoder steps (`decode_rows`).
        prefixes: B lists of target ids every sample of that source starts with.

    Returns:
        For each source row, its `n` samples sorted by decreasing score.
    """
    temperature, n = config.temperature, config.n_best

    def rule(logits: Tensor, logp: Tensor) -> Tensor:
        if temperature == 0:
            return logp.argmax(dim=-1)  # (R,)
        # the same eos constraints: -inf entries of logp stay -inf in the tempered scores
        scores = torch.where(torch.isfinite(logp), logits / temperature, NEG_INF)
        probs = filter_logits(scores, config.top_k, config.top_p).softmax(dim=-1)  # (R, V)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (R,)

    hyps = decode_rows(model, src, n=n, rule=rule, **shared_limits(config, sync_steps, prefixes))
    return [
        sorted(hyps[i : i + n], key=lambda h: h.score, reverse=True) for i in range(0, len(hyps), n)
    ]


__all__ = [
    "TokenRule",
    "decode_rows",
    "filter_logits",
    "greedy_search",
    "make_generator",
    "sample_search",
]
