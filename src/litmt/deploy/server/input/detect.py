"""Language detection for ``POST /detect`` and ``source=auto``, among the model's source
languages only, as LibreTranslate detects (``libretranslate/language.py`` ``detect_languages``
and the ``/translate`` route of ``libretranslate/app.py``).

The detector is lingua (``lingua-language-detector``, in the ``serve`` extra): it runs
offline, its wheel carries its models. `LanguageDetector` builds it once per server, on the
first request that needs it, restricted to the model's source languages
(``LanguageDetectorBuilder.from_languages``), so it can only answer a language the model
reads. A model with one source language needs no detector: that language is the answer, for
sure (confidence 100.0). Where lingua is not installed, or a source language's code is one
lingua does not know, `LanguageDetector.available` is false, one log line says why, and the
server keeps its answer without a detector (one source language: that one; several: a 400
naming them).

Answers, as LibreTranslate's:

- `LanguageDetector.detect_languages` (``/detect``): a list of ``{"confidence": <0-100>,
  "language": <ISO code>}``, best first, languages of no confidence (0.0 when rounded to
  `DIGITS` decimals) left out; for a list ``q``, each language's confidence is its mean over
  the texts, ranked by confidence times the length of the texts it was found in; nothing
  found: ``[{"confidence": 0.0, "language": <the model's first source>}]`` (LibreTranslate
  answers ``en`` there).
- `LanguageDetector.sources_of` (``source=auto``): per text, the best language of that text
  alone when it is longer than `SHORT` characters, else the best of the whole request.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from litmt.deploy.server.routes import libretranslate as lt

log = logging.getLogger(__name__)

SHORT = 40  # LibreTranslate: a text this short takes the whole request's detected language
DIGITS = 2  # confidences are rounded to this many decimals (LibreTranslate's to_dict)


def lingua_language(lingua: Any, code: str) -> Any | None:
    """lingua's `Language` of a model language code (ISO 639-1 or 639-3; regional aliases by
    their language: ``pb`` → pt, ``zt`` → zh), or None for a code lingua does not know."""
    base = lt.model2iso(code).split("-")[0].lower()
    try:
        if len(base) == 2:
            return lingua.Language.from_iso_code_639_1(lingua.IsoCode639_1.from_str(base))
        if len(base) == 3:
            return lingua.Language.from_iso_code_639_3(lingua.IsoCode639_3.from_str(base))
    except (ValueError, KeyError, AttributeError):
        return None
    return None


class LanguageDetector:
    """Detects which of `sources` (model language codes) a text is in.

    Args:
        sources: the model's source languages, in order (the first is the answer when
            nothing is detected).
    """

    def __init__(self, sources: list[str]) -> None:
        self.sources = list(sources)
        self._lock = threading.Lock()
        self._built = False
        self._detector: Any = None  # lingua's LanguageDetector (None: not available)
        self._codes: dict[Any, str] = {}  # lingua Language -> model code

    @property
    def needed(self) -> bool:
        """A detector is needed only to choose among several source languages."""
        return len(self.sources) > 1

    def available(self) -> bool:
        """Whether `detect_languages` and `sources_of` answer (several source languages, lingua
        installed and knowing each of them); the detector is built on the first call."""
        return self.needed and self._get() is not None

    def _get(self) -> Any:
        if not self._built:
            with self._lock:
                if not self._built:
                    self._detector = self._build()
                    self._built = True
        return self._detector

    def _build(self) -> Any:
        """lingua's detector restricted to `sources`, or None (and one log line) where it
        cannot be built."""
        try:
            import lingua
        except ImportError:
            log.warning(
                "language detection is off: lingua-language-detector is not installed "
                "(pip install 'litmt[serve]'); /detect and source=auto answer only for a model "
                "with one source language"
            )
            return None
        codes: dict[Any, str] = {}
        for code in self.sources:
            language = lingua_language(lingua, code)
            if language is None or language in codes:
                why = "does not know" if language is None else "cannot tell apart"
                log.warning(
                    "language detection is off: the language detector %s the source "
                    "language %r (this model's sources: %s); /detect and source=auto answer "
                    "only for a model with one source language",
                    why,
                    code,
                    ", ".join(self.sources),
                )
                return None
            codes[language] = code
        self._codes = codes
        return lingua.LanguageDetectorBuilder.from_languages(*codes).build()

    def candidates(self, text: str) -> list[tuple[str, float]]:
        """(model code, confidence 0-100) of `text`'s languages, best first, those of no
        confidence (0.0 when rounded) left out (empty: nothing detected, e.g. digits only)."""
        values = self._get().compute_language_confidence_values(text)
        found = [(self._codes[v.language], float(v.value) * 100.0) for v in values]
        found = [(code, conf) for code, conf in found if round(conf, DIGITS) > 0]
        return sorted(found, key=lambda c: c[1], reverse=True)

    def detect_languages(self, texts: list[str], batch: bool) -> list[dict[str, Any]]:
        """``/detect``'s answer for `texts` (``q``, a list when `batch`): LibreTranslate's
        ``detect_languages`` on the model's source languages (module docstring)."""
        found: list[tuple[str, float, int]] = [
            (code, conf, len(text))
            for text in texts
            if text
            for code, conf in self.candidates(text)
        ]
        if not found:
            return [{"confidence": 0.0, "language": lt.model2iso(self.sources[0])}]
        if batch:  # one entry per language: mean confidence, summed length
            merged = []
            for code in self.sources:
                same = [f for f in found if f[0] == code]
                if same:
                    mean = sum(f[1] for f in same) / len(same)
                    merged.append((code, mean, sum(f[2] for f in same)))
            found = merged
        total = sum(f[2] for f in found)
        found.sort(key=lambda f: f[1] * f[2] / total, reverse=True)
        return [
            {"confidence": round(conf, DIGITS), "language": lt.model2iso(code)}
            for code, conf, _ in found
        ]

    def sources_of(self, texts: list[str], batch: bool) -> list[dict[str, Any]]:
        """``source=auto``: per text, its detected language (``{"confidence", "language"}``,
        an ISO code): the text's own when it is longer than `SHORT` characters, else the whole
        request's (too short to tell alone), as LibreTranslate's ``/translate``."""
        overall: list[dict[str, Any]] | None = None
        out = []
        for text in texts:
            if len(text) > SHORT:
                out.append(self.detect_languages([text], False)[0])
            else:
                if overall is None:
                    overall = self.detect_languages(texts, batch)
                out.append(overall[0])
        return out

    def model_code(self, iso: str) -> str:
        """The model's code of a language `detect_languages` answered (an ISO code)."""
        return next(code for code in self.sources if lt.model2iso(code) == iso)


__all__ = ["SHORT", "LanguageDetector", "lingua_language"]
