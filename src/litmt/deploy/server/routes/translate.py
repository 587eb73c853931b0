"""The LibreTranslate routes: ``POST /translate`` and those of `litmt.deploy.server.routes.libretranslate`
(``/detect``, ``/frontend/settings``, ``/suggest``, ``/translate_file``, ``/download_file``).

`TranslateService` is the object those routes call (`litmt.deploy.server.routes.libretranslate.Service`
is its interface): each text is planned into units first (`litmt.deploy.server.input.sentences`: lines,
or the sentences of a line over the model's source limit; 413 over a limit), decoded as one
job of the admission path (`litmt.deploy.server.admission`), then rebuilt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from litmt.decoding.config import DecodeConfig
from litmt.decoding.requests import Translation
from litmt.deploy.server.admission import Pair
from litmt.deploy.server.context import ServerContext, language_name
from litmt.deploy.server.errors import ApiError
from litmt.deploy.server.input.request_params import request_texts
from litmt.deploy.server.routes import libretranslate as lt


class TranslateService:
    """The server as the LibreTranslate routes see it (implements `lt.Service`).

    Args:
        ctx: the server's shared parts.
        upload_dir: where ``/translate_file`` writes translated files.
    """

    def __init__(self, ctx: ServerContext, upload_dir: Path) -> None:
        self.ctx, self.upload_dir = ctx, upload_dir
        self.src, self.tgt = ctx.src, ctx.tgt
        self.tgt_name = language_name(ctx.tgt)
        # per text, as LibreTranslate's char_limit; max_chars (the batch) is litmt's own
        self.char_limit = min(ctx.settings.max_text_chars, ctx.settings.max_chars)
        self.beam_size = DecodeConfig.from_options(ctx.options).beam_size  # caps alternatives
        self.api_keys = ctx.guard.keys_on  # /frontend/settings' apiKeys
        self.key_required = bool(ctx.settings.access.require_api_key)

    @property
    def default_source(self) -> dict[str, str]:
        """/frontend/settings' source: auto only where it is answered (one source language,
        or several and a detector: built on the first call), else the first source."""
        sources = self.ctx.detector.sources
        if len(sources) == 1 or self.ctx.detects():
            return {"code": "auto", "name": "Auto Detect"}
        return {"code": lt.model2iso(sources[0]), "name": language_name(sources[0])}

    async def read_params(self, request: Request, files: Any = None) -> dict[str, Any]:
        """The request's parameters within ``max_body_bytes``."""
        return await self.ctx.params(request, files)

    def texts(self, params: dict[str, Any], is_json: bool) -> tuple[list[str], bool]:
        """(the texts of ``q``, whether ``q`` was a list), checked against the limits."""
        return request_texts(params, self.ctx.settings, is_json)

    def check(self, request: Request, params: dict[str, Any], cost: int = 1) -> Any:
        """403 (bad or missing key) or 429 (rate limit) to answer, or None."""
        return self.ctx.guard.check(request, params, cost)

    def auto_source(self) -> str:
        """The model's one source language; 400 for a model with several."""
        return self.ctx.auto_source()

    async def detect(self, texts: list[str], batch: bool) -> list[dict[str, Any]]:
        """``/detect``'s answer (`ServerContext.detect`)."""
        return await self.ctx.detect(texts, batch)

    async def auto_routes(
        self, texts: list[str], target: str, batch: bool
    ) -> tuple[list[dict[str, Any]], list[Pair]]:
        """``source=auto``: per text, its detected language and direction."""
        return await self.ctx.auto_routes(texts, target, batch)

    def route(self, source: str, target: str) -> Pair:
        """The direction of (source, target); 400 for one the model lacks."""
        return self.ctx.route(source, target)

    async def batched(
        self, request: Request, texts: list[str], n_best: int = 1, pair: Pair = None
    ) -> list[Any]:
        """The translations of `texts` in direction `pair` (n-best lists when `n_best` > 1);
        requests of the same direction and n-best share batches."""
        plan = self.ctx.segmenter.plan(texts)  # lines, or sentences of long lines; 413
        out = await self.ctx.admission.translate(request, plan.units, pair, n_best)
        return plan.join(out) if n_best == 1 else plan.join_nbest(out)

    async def steered(
        self, request: Request, texts: list[str], prefixes: Any, constraints: Any, pair: Pair = None
    ) -> tuple[list[str], list[bool]]:
        """The translations of `texts` with their prefixes and constraints (a job of its own
        in the model's queue), and whether each meets all its constraints."""
        ctx = self.ctx
        plan = ctx.segmenter.plan(texts)  # the limits (413) as for any request
        if len(plan.units) != len(texts):
            raise ApiError(
                400,
                "Invalid request: a text with a prefix or constraints must be one line within "
                "the model's source limit",
            )
        constraint_ids = self.capped_constraints(constraints, len(plan.units))
        cost = ctx.admission.steered_cost(plan.units, constraint_ids)

        def job() -> list[list[Translation]]:
            return ctx.translator.translations(
                plan.units,
                prefixes=prefixes,
                constraints=constraints,
                **ctx.options,
                **ctx.admission.direction(pair),
            )

        found = await ctx.admission.call(request, job, "steered", len(plan.units), cost)
        return plan.join([f[0].text for f in found]), [f[0].constraints_met for f in found]

    def capped_constraints(self, constraints: Any, n: int) -> list[Any] | None:
        """The target ids of `n` texts' constraints (None: none sent), within the caps.

        Raises:
            ApiError: 400 over ``max_constraints`` (phrases of one text) or
                ``max_constraint_pieces`` (target pieces of one text's phrases together).
            ConfigError: malformed constraints (400 via its handler).
        """
        if constraints is None:
            return None
        settings = self.ctx.settings
        if isinstance(constraints, list):  # counted before any is encoded
            for i, phrases in enumerate(constraints):
                if isinstance(phrases, list) and len(phrases) > settings.max_constraints:
                    raise ApiError(
                        400,
                        f"Invalid request: text {i} has {len(phrases)} constraints, over the "
                        f"limit (max_constraints={settings.max_constraints})",
                    )
        encode = getattr(self.ctx.translator, "encode_steering", None)
        if encode is None:
            return None
        _, ids = encode(n, None, constraints)
        for i, phrases in enumerate(ids or []):
            pieces = sum(len(c) for c in phrases)
            if pieces > settings.max_constraint_pieces:
                raise ApiError(
                    400,
                    f"Invalid request: the constraints of text {i} have {pieces} target pieces, "
                    f"over the limit (max_constraint_pieces={settings.max_constraint_pieces})",
                )
        return ids


def register_translate_routes(app: FastAPI, ctx: ServerContext, upload_dir: Path) -> None:
    """Add ``POST /translate`` and the other LibreTranslate routes to `app`; translated
    files go to `upload_dir`."""
    svc = TranslateService(ctx, upload_dir)
    lt.register_routes(app, svc)  # /detect, /frontend/settings, /suggest, files

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        params = await ctx.params(request)
        q = params.get("q")
        cost = max(1, len(q)) if isinstance(q, list) else 1  # LibreTranslate charges len(q)
        if denied := ctx.guard.check(request, params, cost):  # 403 bad/missing key, 429 limit
            return denied
        return await lt.translate(request, params, svc)


__all__ = ["TranslateService", "register_translate_routes"]
