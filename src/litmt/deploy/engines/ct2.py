"""The ``ct2`` engine: a `Translator` on a CTranslate2 export (`CT2Translator`), with litmt's semantics.

Every engine gives a `Translator` with the same methods and the same meaning of every option:

>>> from litmt.deploy.loader import load_translator
>>> load_translator("model.ckpt", engine="ct2").translate(["A man is walking."], beam_size=5)

How it keeps litmt's semantics (the conventions of `litmt.decoding.search.rules`):

- Tokenisation and detokenisation are litmt's sentencepiece models (the same `prepare`:
  control characters, empty lines, truncation to max_positions); ids travel to
  CTranslate2 as pieces of the exported vocabulary and come back as ids.
- Output budget: CTranslate2 has one ``max_decoding_length`` per call, litmt one budget per
  sentence, ``min(floor(max_len_a * src_len + max_len_b), max_positions - 1)`` tokens before
  eos (`litmt.decoding.search.rules.output_budgets`, the rule the torch search uses). Sentences
  are grouped by budget and each group is one call, so every sentence gets exactly its own
  budget. ``min_len`` is ``min_decoding_length`` (CTranslate2's default is 1,
  litmt's 0, so it is always passed). CTranslate2 disables eos on the logits before its
  log-softmax (``apply_min_length`` and ``DisableTokens`` in ``src/decoding.cc``), so its
  scores are those of a distribution renormalised without eos; litmt masks eos after the
  softmax (the model's own log-probabilities). Under ``min_len`` the engine therefore
  recomputes every hypothesis' log-probability with ``score_batch`` before the GNMT ranking;
  greedy decisions are the same either way, a beam's may differ where the renormalisation
  reorders its candidates.
- Length penalty: CTranslate2 divides by ``len ** alpha`` (``finalize_hypothesis_score`` in
  ``src/decoding.cc``, len without eos); litmt uses GNMT, ``((5 + n) / 6) ** alpha`` with
  n counting eos. The engine asks CTranslate2 for all ``beam_size`` finished hypotheses
  (a non-zero penalty makes it stop once ``beam_size`` have finished, litmt's rule),
  recovers each log-probability (``score * len ** alpha``, len = tokens + eos, as
  CTranslate2 counts the eos it strips), rescores with GNMT and ranks again. With alpha = 0
  both rank by log-probability and CTranslate2 stops when the best beam ends, like litmt.
  Reported scores are litmt's: GNMT-normalised log-probabilities.
- n-best: the `n_best` best of those, best first.

- A hypothesis cut by its budget ends without eos in CTranslate2, where litmt forces eos:
  the engine adds that eos log-probability (`score_batch`) before ranking.

- Target prefix (`litmt.decoding.steering`): CTranslate2's ``target_prefix``. Read in
  CTranslate2's ``src/decoding.cc`` (``update_sample_with_prefix``, ``get_max_step``,
  ``is_last_step``, ``apply_min_length``, ``split_start_tokens``), for the default
  ``return_prefix=true`` of the Python API: the prefix is decoded step by step inside the
  search, forced at steps < len(prefix), and returned as part of the hypothesis;
  ``max_decoding_length`` and ``min_decoding_length`` count the prefix tokens (so litmt's
  budget, which counts them too and is raised to at least len(prefix), is passed as it is);
  the prefix steps add **nothing** to the score (the forced token's cumulative score is set to
  0, and -1e10 in the other beams), so CTranslate2's scores leave out the prefix's
  log-probabilities. The engine therefore recomputes the log-probability of every hypothesis
  of a sentence with a prefix with ``score_batch`` (its tokens and eos: litmt's number,
  prefix included, also for a hypothesis cut by the budget) before the GNMT ranking.
  Where CTranslate2's prefix rules part from litmt's (eos refused right after the prefix in
  all beams but the first, K copies of a prefix that fills the budget, finished hypotheses
  ranked by a score without the prefix), the engine restores litmt's search:
  `litmt.deploy.engines.ct2_prefix` (a one-step search first, and a sentence with a prefix is
  searched to the end of its budget). So a prefix that is already a whole sentence gets the
  same 1-best (``prefix + eos``) on both engines, and the n-best holds no repeats.
- Terminology constraints: CTranslate2 has no lexically constrained search, so the engine
  refuses them with one line (use engine=torch).
- Stopping (`litmt.decoding.search.stopping`): CTranslate2's search cannot be interrupted
  (its ``callback`` can end a greedy search only, one Python call per token). Under
  `stop_when` (the server) the engine submits each call in sub-batches of at most
  `stop_grain()` sentences, grouped as CTranslate2 groups them (`ct2_batches`), keeps as many
  in flight as CTranslate2 runs at once, and checks before each submission; an abandoned
  decode stops within the sub-batches in flight. Outside `stop_when` every call is
  submitted whole, as before.

What remains different (both rare): without a prefix, when more than K hypotheses have
finished at the stopping step, CTranslate2 keeps the K best by *its* normalisation before the
engine re-ranks them with GNMT (litmt keeps the K best by GNMT), so a GNMT-best hypothesis
can be dropped (with a prefix the engine avoids it, `litmt.deploy.engines.ct2_prefix` rule 4, at the
cost of longer searches); and at the budget's last step CTranslate2 finishes its K best
candidates, litmt its K best non-eos ones (plus the forced eos). On 200 Multi30k test
sentences (beam 5, alpha 1) 197 translations were identical, with equal BLEU; greedy
decoding was identical on all.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.decoding.config import DecodeConfig
from litmt.decoding.languages import Languages
from litmt.decoding.search.rules import Hypothesis, budget_floor, output_budgets
from litmt.decoding.search.stopping import check_stop, stop_grain
from litmt.decoding.translator import Translator
from litmt.decoding.translator_base import DecodeRequest
from litmt.deploy.engines.cache import default_cache_dir
from litmt.deploy.engines.ct2_prefix import (
    Call,
    distinct,
    finished_before_stop,
    plan_calls,
    returns_every_beam,
    secondary_eos,
)
from litmt.deploy.export.ct2 import cached_export, is_export_dir, read_metadata
from litmt.deploy.export.ct2_spec import ct2_vocabulary, import_ctranslate2
from litmt.errors import ConfigError
from litmt.runtime.threads import ct2_thread_options

log = logging.getLogger("litmt.deploy.engines.ct2")


class CT2Translator(Translator):
    """A `Translator` running a CTranslate2 export (same `translate`/`search_ids` options).

    Args:
        model_dir: a directory written by `litmt.deploy.export.ct2.export_model`.
        device: "cpu", "cuda", or None/"auto" (CUDA when CTranslate2 sees a GPU).
        compute_type: CTranslate2 compute type; "default" keeps the export's quantization.
        threads: CPU threads (0 = torch's thread count), as `litmt.runtime.threads` says:
            on the CPU that many batches at once, one thread each (``inter_threads``).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str | None = None,
        compute_type: str = "default",
        threads: int = 0,
    ) -> None:
        ct2 = import_ctranslate2()
        self.model_dir = Path(model_dir)
        self.meta = read_metadata(self.model_dir)
        if device in (None, "auto"):
            device = "cuda" if ct2.get_cuda_device_count() > 0 else "cpu"
        if str(device).startswith("cuda") and ct2.get_cuda_device_count() == 0:
            raise ConfigError(
                f"device={device} was asked for but CTranslate2 sees no GPU; use device=cpu"
            )
        kind, _, index = str(device).partition(":")
        self.ct2 = ct2.Translator(
            str(self.model_dir),
            device=kind,
            device_index=int(index or 0),
            compute_type=compute_type,
            **ct2_thread_options(kind, threads),
        )
        self.model, self.models = None, []  # no torch model: the search runs in CTranslate2
        self.device = torch.device(str(device))  # where CTranslate2 runs (for messages)
        self.autocast = None  # the torch engine's decode precision: unused here
        # the export's decoding defaults (litmt.json) are the base options override
        self.default_config = DecodeConfig.from_options(self.meta.get("decoding"))
        self.tokenizer = Tokenizer.load(self.model_dir)
        self.src_lang, self.tgt_lang = self.meta["src_lang"], self.meta["tgt_lang"]
        self.languages = Languages.from_meta(self.meta)  # directions (a multilingual export)
        self._src_pieces = ct2_vocabulary(self.tokenizer, "src")
        self._tgt_pieces = ct2_vocabulary(self.tokenizer, "tgt")
        self._tgt_ids = {p: i for i, p in enumerate(self._tgt_pieces)}

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | None = None,
        compute_type: str = "default",
        threads: int = 0,
        cache_dir: str | Path | None = None,
        quantization: str = "none",
    ) -> CT2Translator:
        """From an export directory, or a ``.ckpt`` converted into `cache_dir` on first use."""
        p = Path(path)
        if not is_export_dir(p):
            if p.is_dir():
                read_metadata(p)  # raises: a directory that is not an export
            if not p.is_file():
                raise ConfigError(
                    f"model not found: {p} (give a .ckpt file or an export directory)"
                )
            p = cached_export(p, cache_dir or default_cache_dir(), quantization)
        return cls(p, device=device, compute_type=compute_type, threads=threads)

    @property
    def max_source_tokens(self) -> int:
        """Longest source the model accepts (its `max_positions`)."""
        return int(self.meta["max_positions"])

    @property
    def engine(self) -> str:
        return "ct2"

    def check_request(self, request: DecodeRequest) -> None:
        """Beam and greedy only; constraints are refused; a prefix must fit the output.

        Raises:
            ConfigError: one line naming what to use instead.
        """
        if request.config.effective_method == "sample":
            raise ConfigError("engine=ct2 does not sample; use engine=torch for method=sample")
        if request.constraints is not None and any(request.constraints):
            raise ConfigError(
                "engine=ct2 cannot apply terminology constraints (CTranslate2 has no "
                "constrained search); use engine=torch"
            )
        super().check_request(dataclasses.replace(request, constraints=None))

    def decode_batches(
        self, request: DecodeRequest
    ) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
        """Decode with CTranslate2, one call per output budget (module docstring) and per
        prefix rule (`litmt.deploy.engines.ct2_prefix.plan_calls`); every call is submitted first, so
        CTranslate2 decodes them in parallel. Under `stop_when` (the server), the calls run
        in sub-batches instead (`_stoppable_results`), so an abandoned decode stops within one.
        """
        budgets = self._budgets(request)
        blocked = self._eos_blocked(request, budgets)
        calls = list(plan_calls(request, budgets, blocked).items())
        grain = stop_grain()
        if grain is None:  # everything submitted at once, each call collected when its turn comes
            futures = [self._submit(request, idx, call) for call, idx in calls]
            results: list[list[Any]] | None = None
        else:
            results = self._stoppable_results(request, calls, grain)
        for n, (call, idx) in enumerate(calls):
            if call.budget == 0:  # only eos is allowed: the empty translation
                yield idx, [[Hypothesis([], 0.0, 0.0)] for _ in idx]
                continue
            found = results[n] if results is not None else [f.result() for f in futures[n]]
            yield idx, self._collect(request, call, idx, found, blocked)

    def _stoppable_results(
        self, request: DecodeRequest, calls: list[tuple[Call, list[int]]], grain: int
    ) -> list[list[Any]]:
        """The CTranslate2 results of every call (one per sentence, in `idx` order), decoded
        in sub-batches of at most `grain` sentences (`ct2_batches`), as many in flight as
        CTranslate2 runs at once (``num_translators``); `check_stop` runs before each
        submission.

        Raises:
            DecodeStopped: the `stop_when` check turned true; the sub-batches in flight
                finish in CTranslate2's threads and are dropped, nothing more is submitted.
        """
        work = [
            (n, group)
            for n, (call, idx) in enumerate(calls)
            if call.budget > 0
            for group in ct2_batches(
                [len(request.sources[i]) for i in idx], request.max_tokens, grain
            )
        ]
        results: list[list[Any]] = [[None] * len(idx) for _, idx in calls]
        in_flight: deque[tuple[int, list[int], list[Any]]] = deque()

        def settle_oldest() -> None:
            n, group, futures = in_flight.popleft()
            for position, future in zip(group, futures, strict=True):
                results[n][position] = future.result()

        for step, (n, group) in enumerate(work):
            while len(in_flight) >= max(1, self.ct2.num_translators):
                settle_oldest()
            check_stop(step)
            call, idx = calls[n]
            in_flight.append((n, group, self._submit(request, [idx[p] for p in group], call)))
        while in_flight:
            settle_oldest()
        return results

    def _collect(
        self,
        request: DecodeRequest,
        call: Call,
        idx: list[int],
        found: list[Any],
        blocked: set[int],
    ) -> list[list[Hypothesis]]:
        """The n-best of sentences `idx` from their CTranslate2 `call`'s results `found` (one
        per sentence), by litmt's rules."""
        config, sources, prefixes = request.config, request.sources, request.prefixes
        alpha, rescore = config.length_penalty, returns_every_beam(config)
        hyps = [distinct(self._log_probs(r, alpha, rescore, call.budget)) for r in found]
        for r, i in enumerate(idx):
            if call.exhaustive:  # what litmt's search finishes before it stops
                hyps[r] = finished_before_stop(hyps[r], config.beam_size, int(i in blocked))
            if i in blocked:  # prefix + eos, its log-probability from _rescore
                hyps[r].append((list(prefixes[i]), 0.0))
        self._add_forced_eos(idx, sources, hyps, call.budget)
        rows = [
            r
            for r, i in enumerate(idx)
            if config.min_len > 0 or (prefixes is not None and prefixes[i])
        ]
        self._rescore(idx, sources, rows, hyps)
        return [_best(sentence, alpha, config.n_best) for sentence in hyps]

    def _eos_blocked(self, request: DecodeRequest, budgets: list[int]) -> set[int]:
        """The sentences of ``request.todo`` (`budgets`: theirs) with a prefix after which eos
        is a candidate CTranslate2 would replace (`secondary_eos`): beam search only, a
        budget above the prefix, and ``min_len`` allowing eos right after it."""
        config, prefixes = request.config, request.prefixes
        if prefixes is None or config.beam_size == 1:
            return set()
        todo = [
            i
            for i, budget in zip(request.todo, budgets, strict=True)
            if prefixes[i] and config.min_len <= len(prefixes[i]) < budget
        ]
        found = secondary_eos(
            self.ct2,
            [[self._src_pieces[t] for t in request.sources[i]] for i in todo],
            [[self._tgt_pieces[t] for t in prefixes[i]] for i in todo],
            beam_size=config.beam_size,
            min_len=config.min_len,
            max_batch_size=request.max_tokens,
        )
        return {i for i, secondary in zip(todo, found, strict=True) if secondary}

    def _budgets(self, request: DecodeRequest) -> list[int]:
        """The output budget of each sentence of ``request.todo`` (`output_budgets`, raised
        to hold its prefix)."""
        config, todo = request.config, request.todo
        floor = None
        if request.prefixes is not None:
            floor = budget_floor(self.max_source_tokens, request.rows(request.prefixes, todo))
        lengths = [len(request.sources[i]) for i in todo]
        budget = output_budgets(
            lengths, config.max_len_a, config.max_len_b, self.max_source_tokens, floor
        )
        return budget.tolist()

    def _submit(self, request: DecodeRequest, idx: list[int], call: Call) -> list[Any]:
        """Start CTranslate2 on sentences `idx` with the settings of `call`: its futures, one
        per sentence (none for budget 0, where only eos is allowed)."""
        if call.budget == 0:
            return []
        config, sources, prefixes = request.config, request.sources, request.prefixes
        target_prefix = None
        if prefixes is not None and any(prefixes[i] for i in idx):
            target_prefix = [
                [self._tgt_pieces[t] for t in prefixes[i]] if prefixes[i] else None for i in idx
            ]
        return self.ct2.translate_batch(
            [[self._src_pieces[t] for t in sources[i]] for i in idx],
            target_prefix,
            max_batch_size=request.max_tokens,
            batch_type="tokens",
            return_scores=True,
            max_input_length=0,
            asynchronous=True,
            **call.search_options(config),
        )

    def _log_probs(
        self, result: Any, alpha: float, rescore: bool, budget: int
    ) -> list[tuple[list[int], float]]:
        """(tokens, log P) of each hypothesis of one CTranslate2 result."""
        out = []
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            tokens = [self._tgt_ids[p] for p in pieces]
            n = len(tokens)
            if rescore:  # CTranslate2's score is log P / len ** alpha, len counting eos
                steps = n if n == budget else n + 1  # n == budget: cut by the budget, no eos
                out.append((tokens, float(score) * steps**alpha))
            else:
                out.append((tokens, float(score)))
        return out

    def _rescore(
        self,
        idx: list[int],
        sources: Sequence[Sequence[int]],
        rows: list[int],
        hyps: list[list[tuple[list[int], float]]],
    ) -> None:
        """In place: the log-probability of every hypothesis of the sentences `rows` (positions
        in `idx`), from `score_batch` (its tokens and eos): litmt's number where CTranslate2's
        own differs, for a sentence with a prefix (its search leaves the prefix steps out) and
        under ``min_len`` (it renormalises the distribution without eos; module docstring)."""
        where = [(r, h) for r in rows for h in range(len(hyps[r]))]
        for (r, h), log_probs in zip(where, self._scored(idx, sources, hyps, where), strict=True):
            hyps[r][h] = (hyps[r][h][0], float(sum(log_probs)))

    def _scored(
        self,
        idx: list[int],
        sources: Sequence[Sequence[int]],
        hyps: list[list[tuple[list[int], float]]],
        where: list[tuple[int, int]],
    ) -> list[list[float]]:
        """CTranslate2's per-token log-probabilities (eos included) of hypothesis h of row r,
        for each (r, h) in `where` (`score_batch`; nothing is run when `where` is empty)."""
        if not where:
            return []
        scored = self.ct2.score_batch(
            [[self._src_pieces[t] for t in sources[idx[r]]] for r, _ in where],
            [[self._tgt_pieces[t] for t in hyps[r][h][0]] for r, h in where],
        )
        return [list(res.log_probs) for res in scored]

    def _add_forced_eos(
        self,
        idx: list[int],
        sources: Sequence[Sequence[int]],
        hyps: list[list[tuple[list[int], float]]],
        budget: int,
    ) -> None:
        """In place: add log P(eos) to hypotheses cut by the budget, as litmt forces eos there.

        CTranslate2 ends such a hypothesis without eos; `score_batch` gives the eos term
        (its last log-prob), so their scores and ranking are litmt's.
        """
        where = [
            (r, h)
            for r, sent in enumerate(hyps)
            for h, (t, _) in enumerate(sent)
            if len(t) == budget
        ]
        for (r, h), log_probs in zip(where, self._scored(idx, sources, hyps, where), strict=True):
            tokens, log_prob = hyps[r][h]
            hyps[r][h] = (tokens, log_prob + float(log_probs[-1]))


def ct2_batches(lengths: Sequence[int], max_tokens: int, max_sentences: int) -> list[list[int]]:
    """Positions of `lengths` grouped as CTranslate2 groups a call's examples, with at most
    `max_sentences` per group.

    CTranslate2 4.x ``rebatch_input`` (src/batch_reader.cc) sorts the examples from the
    longest source to the shortest, then ``BatchReader::get_next`` fills a batch while the
    sum of source lengths (``batch_type="tokens"``) stays within ``max_batch_size``, always
    taking at least one example. A group of this function is one such batch (cut earlier at
    `max_sentences`), so CTranslate2 runs each group as one batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    tokens = 0
    for i in order:
        full = tokens > 0 and tokens + lengths[i] > max_tokens
        if not groups or full or len(groups[-1]) >= max_sentences:
            groups.append([])
            tokens = 0
        groups[-1].append(i)
        tokens += lengths[i]
    return groups


def _best(found: list[tuple[list[int], float]], alpha: float, n_best: int) -> list[Hypothesis]:
    """The `n_best` of one sentence's (tokens, log P) by GNMT score (n = tokens + eos)."""
    ranked = [Hypothesis.normalised(tokens, log_prob, alpha) for tokens, log_prob in found]
    ranked.sort(key=lambda h: h.score, reverse=True)
    return ranked[:n_best]


__all__ = ["CT2Translator", "ct2_batches"]
