"""What every route group of the server shares (`ServerContext`), built once by `create_app`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from litmt.decoding.languages import Languages
from litmt.deploy.server.access import AccessGuard
from litmt.deploy.server.admission import Admission, Pair
from litmt.deploy.server.config import ServeConfig
from litmt.deploy.server.errors import ApiError
from litmt.deploy.server.request_params import read_params
from litmt.deploy.server.routes import libretranslate as lt
from litmt.deploy.server.sentences import Segmenter
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

    def __post_init__(self) -> None:
        self.src, self.tgt = self.translator.src_lang, self.translator.tgt_lang

    async def params(
        self, request: Request, files: dict[str, tuple[str, bytes]] | None = None
    ) -> dict[str, Any]:
        """The request's parameters within ``max_body_bytes`` (`read_params`)."""
        return await read_params(request, self.settings.max_body_bytes, files)

    def auto_source(self) -> str:
        """What ``source=auto`` reads as: the model's one source language. litmt has no
        language detector, so a model with several source languages refuses ``auto`` with a
        400 naming them, rather than reporting a language it did not detect."""
        sources = self.languages.sources() if self.languages.multilingual else [self.src]
        if len(sources) > 1:
            raise ApiError(
                400,
                f"source=auto is not supported: this model translates from "
                f"{', '.join(lt.model2iso(s) for s in sources)} and does not detect "
                f"languages; give source as one of them",
            )
        return sources[0]

    def route(self, source: str, target: str) -> Pair:
        """A request's direction (model codes; None: the one pair), or 400 for one the
        model lacks: ``"zz is not supported"`` for a language the model does not know (as
        LibreTranslate), the translator's message for a known pair it does not translate;
        ``source="auto"`` is `auto_source` (400 for a model with several sources)."""
        if not self.languages.multilingual:
            lt.check_pair(source, target, self.src, self.tgt)
            return None
        known = {lang for pair in self.languages.pairs() for lang in pair}
        for code in ([] if source == "auto" else [source]) + [target]:  # source first
            if code not in known:
                raise ApiError(400, f"{code} is not supported")  # LibreTranslate's message
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
