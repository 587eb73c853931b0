"""The LibreTranslate routes: ``POST /translate`` and those of `litmt.deploy.libretranslate`
(``/detect``, ``/frontend/settings``, ``/suggest``, ``/translate_file``, ``/download_file``).

Each text is planned into units first (`litmt.deploy.sentences`: lines, or the sentences of a
line over the model's source limit; 413 over a limit), decoded through the admission path
(`litmt.deploy.admission`), then rebuilt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from litmt.decoding.config import DecodeConfig
from litmt.deploy import libretranslate as lt
from litmt.deploy.admission import Pair
from litmt.deploy.http_errors import ApiError
from litmt.deploy.request_params import request_texts
from litmt.deploy.server_context import ServerContext, language_name


def _batched(ctx: ServerContext) -> Any:
    """`lt.Service.batched` and ``.nbest``: a request's texts translated by units."""

    async def batched(
        request: Request, texts: list[str], n_best: int = 1, pair: Pair = None
    ) -> Any:
        """The translations of `texts` in direction `pair` (n-best lists when `n_best` > 1),
        or the error response (503, 499) to answer."""
        plan = ctx.segmenter.plan(texts)  # lines, or sentences of long lines; 413 over a limit
        out = await ctx.admission.translate(request, plan.units, pair, n_best)
        if isinstance(out, JSONResponse):
            return out
        return plan.join(out) if n_best == 1 else plan.join_nbest(out)

    return batched


def _steered(ctx: ServerContext) -> Any:
    """`lt.Service.steered`: texts with prefixes and constraints, one job each request."""

    async def steered(
        request: Request, texts: list[str], prefixes: Any, constraints: Any, pair: Pair = None
    ) -> Any:
        """The translations of `texts` with their prefixes and constraints (one job in the
        model's thread), or the error response to answer."""
        plan = ctx.segmenter.plan(texts)  # the limits (413) as for any request
        if len(plan.units) != len(texts):
            raise ApiError(
                400,
                "Invalid request: a text with a prefix or constraints must be one line within "
                "the model's source limit",
            )

        def job() -> list[str]:
            return ctx.translator.translate(
                plan.units,
                prefixes=prefixes,
                constraints=constraints,
                **ctx.options,
                **ctx.admission.direction(pair),
            )

        return plan.join(await ctx.admission.run(job))

    return steered


def service(ctx: ServerContext, upload_dir: Path) -> lt.Service:
    """What the LibreTranslate routes need from the server."""
    batched = _batched(ctx)
    return lt.Service(
        src=ctx.src,
        tgt=ctx.tgt,
        tgt_name=language_name(ctx.tgt),
        # per text, as LibreTranslate's char_limit; max_chars (the batch) is litmt's own
        char_limit=min(ctx.settings.max_text_chars, ctx.settings.max_chars),
        beam_size=DecodeConfig.from_options(ctx.options).beam_size,
        read_params=ctx.params,
        texts=lambda params, is_json: request_texts(params, ctx.settings, is_json),
        batched=batched,
        nbest=lambda request, texts, n, pair=None: batched(request, texts, n, pair),
        route=ctx.route,
        steered=_steered(ctx),
        upload_dir=upload_dir,
        check=ctx.guard.check,
        api_keys=ctx.guard.keys_on,
        key_required=bool(ctx.settings.access.require_api_key),
    )


def register_translate_routes(app: FastAPI, ctx: ServerContext, upload_dir: Path) -> None:
    """Add ``POST /translate`` and the other LibreTranslate routes to `app`; translated
    files go to `upload_dir`."""
    svc = service(ctx, upload_dir)
    lt.register_routes(app, svc)  # /detect, /frontend/settings, /suggest, files

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        params = await ctx.params(request)
        q = params.get("q")
        cost = max(1, len(q)) if isinstance(q, list) else 1  # LibreTranslate charges len(q)
        if denied := ctx.guard.check(request, params, cost):  # 403 bad/missing key, 429 limit
            return denied
        return await lt.translate(request, params, svc)


__all__ = ["register_translate_routes", "service"]
