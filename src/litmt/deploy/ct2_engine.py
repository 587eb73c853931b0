"""Decoding engines: ``torch`` (litmt's own search) and ``ct2`` (CTranslate2).

Both give a `Translator` with the same methods and the same meaning of every option:

>>> from litmt.deploy.engines import load_translator
>>> load_translator("model.ckpt", engine="ct2").translate(["A man is walking."], beam_size=5)

How the CTranslate2 engine keeps litmt's semantics (``litmt.decoding.search`` module docstring):

- Tokenisation and detokenisation are litmt's sentencepiece models (the same `prepare`:
  control characters, empty lines, truncation to max_positions); ids travel to
  CTranslate2 as pieces of the exported vocabulary and come back as ids.
- Output budget: CTranslate2 has one ``max_decoding_length`` per call, litmt one budget per
  sentence, ``min(floor(max_len_a * src_len + max_len_b), max_positions - 1)`` tokens before
  eos (`litmt.decoding.search_rules.output_budgets`, the rule the torch search uses). Sentences
  are grouped by budget and each group is one call, so every sentence gets exactly its own
  budget. ``min_len`` is ``min_decoding_length`` (CTranslate2's default is 1,
  litmt's 0, so it is always passed).
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
  One more difference in beam search: at the first step after the prefix, CTranslate2 gives
  eos in any beam but the first -1e10 (its issue #277), where litmt may finish ``prefix +
  eos`` from a lower candidate; it matters only when that empty continuation would win.
- Terminology constraints: CTranslate2 has no lexically constrained search, so the engine
  refuses them with one line (use engine=torch).

What remains different (both rare, both near-ties): when more than K hypotheses have finished
at the stopping step, CTranslate2 keeps the K best by *its* normalisation before the engine
re-ranks them with GNMT (litmt keeps the K best by GNMT), so a GNMT-best hypothesis can be
dropped; and at the budget's last step CTranslate2 finishes its K best candidates, litmt its
K best non-eos ones (plus the forced eos). On 200 Multi30k test sentences (beam 5, alpha 1)
197 translations were identical, with equal BLEU; greedy decoding was identical on all.
Asking CTranslate2 for more hypotheses (``patience``) would remove the first difference at
the cost of longer searches.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from litmt.data.tokenizer import Tokenizer
from litmt.decoding.config import DecodeConfig
from litmt.decoding.languages import Languages
from litmt.decoding.search_rules import Hypothesis, output_budgets
from litmt.decoding.steering import budget_floor
from litmt.decoding.translator import Translator
from litmt.decoding.translator_base import DecodeRequest
from litmt.deploy.ct2_export import cached_export, is_export_dir, read_metadata
from litmt.deploy.ct2_spec import ct2_vocabulary, import_ctranslate2
from litmt.errors import ConfigError
from litmt.runtime.threads import ct2_thread_options

log = logging.getLogger("litmt.deploy.ct2_engine")


def default_cache_dir() -> Path:
    """Where checkpoints are converted for the ct2 engine: ``$XDG_CACHE_HOME/litmt/ct2``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "litmt" / "ct2"


class CT2Translator(Translator):
    """A `Translator` running a CTranslate2 export (same `translate`/`search_ids` options).

    Args:
        model_dir: a directory written by `litmt.deploy.ct2_export.export_model`.
        device: "cpu", "cuda", or None/"auto" (CUDA when CTranslate2 sees a GPU).
        compute_type: CTranslate2 compute type; "default" keeps the export's quantization.
        threads: CPU threads (0 = CTranslate2's default), as `litmt.runtime.threads` says:
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
        """Decode with CTranslate2, one call per output budget (module docstring); every
        call is submitted first, so CTranslate2 decodes them in parallel."""
        config, sources, prefixes = request.config, request.sources, request.prefixes
        groups: dict[int, list[int]] = defaultdict(list)
        for i, budget in zip(request.todo, self._budgets(request), strict=True):
            groups[budget].append(i)
        pending = [
            (budget, idx, self._submit(request, idx, budget))
            for budget, idx in sorted(groups.items())
        ]
        for budget, idx, futures in pending:
            if budget == 0:  # only eos is allowed: the empty translation
                yield idx, [[Hypothesis([], 0.0, 0.0)] for _ in idx]
                continue
            hyps = [
                self._log_probs(f.result(), config.length_penalty, _rescore(config), budget)
                for f in futures
            ]
            self._add_forced_eos(idx, sources, hyps, budget)
            if prefixes is not None:
                self._rescore_prefixed(idx, sources, prefixes, hyps)
            alpha, n_best = config.length_penalty, config.n_best
            yield idx, [_best(sentence, alpha, n_best) for sentence in hyps]

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

    def _submit(self, request: DecodeRequest, idx: list[int], budget: int) -> list[Any]:
        """Start CTranslate2 on sentences `idx` of one output `budget`: its futures, one per
        sentence (none for budget 0, where only eos is allowed)."""
        if budget == 0:
            return []
        config, sources, prefixes = request.config, request.sources, request.prefixes
        target_prefix = None
        if prefixes is not None and any(prefixes[i] for i in idx):
            target_prefix = [
                [self._tgt_pieces[t] for t in prefixes[i]] if prefixes[i] else None for i in idx
            ]
        rescore = _rescore(config)
        return self.ct2.translate_batch(
            [[self._src_pieces[t] for t in sources[i]] for i in idx],
            target_prefix,
            max_batch_size=request.max_tokens,
            batch_type="tokens",
            beam_size=config.beam_size,
            num_hypotheses=config.beam_size if rescore else config.n_best,
            length_penalty=config.length_penalty if rescore else 0.0,
            return_scores=True,
            max_input_length=0,
            max_decoding_length=budget,
            min_decoding_length=min(config.min_len, budget),
            asynchronous=True,
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

    def _rescore_prefixed(
        self,
        idx: list[int],
        sources: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[int]],
        hyps: list[list[tuple[list[int], float]]],
    ) -> None:
        """In place: the log-probability of every hypothesis of a sentence with a prefix, from
        `score_batch` (its tokens and eos), as CTranslate2's search scores leave the prefix
        steps out (module docstring)."""
        where = [(r, h) for r, i in enumerate(idx) if prefixes[i] for h in range(len(hyps[r]))]
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


def _best(found: list[tuple[list[int], float]], alpha: float, n_best: int) -> list[Hypothesis]:
    """The `n_best` of one sentence's (tokens, log P) by GNMT score (n = tokens + eos)."""
    ranked = [Hypothesis.normalised(tokens, log_prob, alpha) for tokens, log_prob in found]
    ranked.sort(key=lambda h: h.score, reverse=True)
    return ranked[:n_best]


def _rescore(config: DecodeConfig) -> bool:
    """Whether CTranslate2 returns every beam, rescored here with GNMT (module docstring)."""
    return config.beam_size > 1 and config.length_penalty != 0


__all__ = ["CT2Translator", "default_cache_dir"]
