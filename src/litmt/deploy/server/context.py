"""What every route group of the server shares (`ServerContext`), built once by `create_app`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from litmt.decoding.languages import Languages
from litmt.deploy.server.access import AccessGuard
from litmt.deploy.server.admission import Admission, Pair
from litmt.deploy.server.config import ServeConfig
from litmt.deploy.server.errors import ApiError
from litmt.deploy.server.input.detect import LanguageDetector
from litmt.deploy.server.input.request_params import read_params
from litmt.deploy.server.input.sentences import Segmenter
from litmt.deploy.server.routes import libretranslate as lt
from litmt.errors import ConfigError

LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip


def language_name(code: str) -> str:
    """English name of a language code (the code itself when unknown)."""
    return LANGUAGE_NAMES.get(code, code)


@dataclass
class ServerContext:
    """The served model, its settings and the way into it, shared by the route groups."""

    translator: Any  # the `Translator` (torch or ct2) answering /translate
    settings: ServeConfig
    options: dict[str, Any]  # `Translator.translate` options of every translation
    languages: Languages  # the model's directions
    segmenter: Segmenter  # lines, or sentences of long lines, within the request limits
    admission: Admission  # the model's thread, its batchers and the 503/504/499 answers
    guard: AccessGuard  # API keys and the rate limit (403/429)
    engine: str  # the engine's name, reported by /health
    attention_model: Any | None  # a torch `Translator` for /attention (None: 501)
    src: str = field(init=False)  # the translator's source language (its first direction's)
    tgt: str = field(init=False)  # and its target language
    # /detect and source=auto among the model's source languages (lingua, built on first use)
    detector: LanguageDetector = field(init=False)

    def __post_init__(self) -> None:
        self.src, self.tgt = self.translator.src_lang, self.translator.tgt_lang
        sources = self.languages.sources() if self.languages.multilingual else [self.src]
        self.detector = LanguageDetector(sources)

    async def params(
        self, request: Request, files: dict[str, tuple[str, bytes]] | None = None
    ) -> dict[str, Any]:
        """The request's parameters within ``max_body_bytes`` (`read_params`)."""
        return await read_params(request, self.settings.max_body_bytes, files)

    def auto_source(self) -> str:
        """What ``source=auto`` reads as where no language is detected: the model's one
        source language. A model with several source languages refuses ``auto`` here with a
        400 naming them, rather than reporting a language it did not detect (``/translate``
        and ``/detect`` detect instead where `detects`; ``/attention`` and
        ``/translate_file`` never do)."""
        sources = self.languages.sources() if self.languages.multilingual else [self.src]
        if len(sources) > 1:
            detail = "" if self.detects() else " and does not detect languages"
            raise ApiError(
                400,
                f"source=auto is not supported: this model translates from "
                f"{', '.join(lt.model2iso(s) for s in sources)}{detail}; give source as one "
                f"of them",
            )
        return sources[0]

    def detects(self) -> bool:
        """Whether ``/detect`` and ``source=auto`` run the language detector: the model has
        several source languages and lingua knows them (built on the first call;
        `litmt.deploy.server.input.detect`)."""
        return self.detector.available()

    async def detect(self, texts: list[str], batch: bool) -> list[dict[str, Any]]:
        """``/detect``'s answer: LibreTranslate's list of ``{"confidence", "language"}``,
        best first; without a detector, the one source language for sure (400 for several)."""
        if not self.detects():
            return [lt.detection(self.auto_source())]
        return await run_in_threadpool(self.detector.detect_languages, texts, batch)

    async def auto_routes(
        self, texts: list[str], target: str, batch: bool
    ) -> tuple[list[dict[str, Any]], list[Pair]]:
        """``source=auto``: per text, its detected language (``detectedLanguage``) and the
        direction it is translated in; 400 for an unknown target (before detecting) or a
        detected source that does not reach `target`. Without a detector: the model's one
        source language for every text (400 for several)."""
        if not self.detects():
            pair = self.route("auto", target)
            found = lt.detection(pair[0] if pair else self.src)
            return [found] * len(texts), [pair] * len(texts)
        self._check_known([target])
        found = await run_in_threadpool(self.detector.sources_of, texts, batch)
        pairs: dict[str, Pair] = {}
        for item in found:
            code = self.detector.model_code(item["language"])
            if code not in pairs:
                pairs[code] = self.route(code, target)
        return found, [pairs[self.detector.model_code(item["language"])] for item in found]

    def _check_known(self, codes: list[str]) -> None:
        """400 ``"zz is not supported"`` (LibreTranslate's message) for the first of `codes`
        that no direction of the (multilingual) model has."""
        known = {lang for pair in self.languages.pairs() for lang in pair}
        for code in codes:
            if code not in known:
                raise ApiError(400, f"{code} is not supported")

    def route(self, source: str, target: str) -> Pair:
        """A request's direction (model codes; None: the one pair), or 400 for one the
        model lacks: ``"zz is not supported"`` for a language the model does not know (as
        LibreTranslate), the translator's message for a known pair it does not translate;
        ``source="auto"`` is `auto_source` (400 for a model with several sources)."""
        if not self.languages.multilingual:
            lt.check_pair(source, target, self.src, self.tgt)
            return None
        self._check_known(([] if source == "auto" else [source]) + [target])  # source first
        if source == "auto":
            source = self.auto_source()
        try:
            found = self.translator.route(
                source, target, allow_zero_shot=self.settings.allow_zero_shot
            )
        except ConfigError as exc:
            raise ApiError(400, str(exc)) from None
        return (found.src_lang, found.tgt_lang)


__all__ = ["LANGUAGE_NAMES", "ServerContext", "language_name"]
