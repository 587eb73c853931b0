"""The attention explorer: the page (``GET /``, ``/static``) and ``POST /attention``.

``POST /attention`` with ``{"q": sentence}`` (optionally ``layer``: an int or ``"all"``,
``head``: an int or ``"mean"``, and ``source``/``target``) → the greedy translation, the
source/target pieces and one cross-attention map of the torch model
(`litmt.deploy.server.routes.attention_view`), or every map with ``layer="all"``; at most
``attention_max_tokens`` source and target tokens (more source tokens: 413, never truncated).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from litmt.deploy.server.context import ServerContext
from litmt.deploy.server.errors import ApiError
from litmt.deploy.server.routes import libretranslate as lt
from litmt.deploy.server.routes.attention_view import (
    attention_maps,
    attention_payload,
    check_choice,
)

STATIC_DIR = Path(__file__).parents[1] / "static"  # deploy/server/static
# the 501 of /attention without a torch model (the page shows it as its error line)
NO_ATTENTION = (
    "attention maps need the torch model, which this server has not loaded: an export runs "
    "on CTranslate2, which returns one averaged alignment, not the page's per-layer, per-head "
    "maps; serve a .ckpt with explorer=true"
)


def _json_in_pieces(value: list[Any]) -> str:
    """JSON of nested lists of numbers, one innermost list per `json.dumps` call, so that a
    thread encoding a large attention payload lets the event loop's thread run in between
    (one call on it all would hold the GIL throughout)."""
    if not value or not isinstance(value[0], list):
        return json.dumps(value)
    return "[" + ",".join(_json_in_pieces(v) for v in value) + "]"


def attention_route(ctx: ServerContext, params: dict[str, Any]) -> Any:
    """The `/attention` request's direction (``source``/``target``, LibreTranslate codes;
    both absent = the model's first direction), or 400 for one the model lacks."""
    source, target = params.get("source"), params.get("target")
    if not source and not target:
        return None
    if not source or not target:
        raise ApiError(400, "Invalid request: give both source and target, or neither")
    pair = ctx.route(lt.iso2model(str(source)), lt.iso2model(str(target)))  # as /translate
    if pair is None:  # a one-pair model: its pair
        return None
    return ctx.attention_model.route(*pair, allow_zero_shot=ctx.settings.allow_zero_shot)


def checked_sentence(ctx: ServerContext, params: dict[str, Any]) -> str:
    """The request's ``q``: one non-empty string within ``max_chars`` and the attention
    token cap (the model's source limit and ``attention_max_tokens``), else 400/413."""
    model, settings = ctx.attention_model, ctx.settings
    q = params.get("q")
    if not isinstance(q, str) or not q.strip():
        raise ApiError(400, "Invalid request: q must be a non-empty string")
    if len(q) > settings.max_chars:
        raise ApiError(
            413,
            f"Invalid request: request ({len(q)}) exceeds text limit ({settings.max_chars})",
        )
    n_src = len(model.tokenizer.encode_src([q.replace("\n", " ")])[0])
    cap = min(settings.attention_max_tokens, int(model.max_source_tokens))
    if n_src > cap:  # refused, not truncated
        raise ApiError(
            413,
            f"Invalid request: {n_src} source tokens, over the attention limit ({cap}: "
            f"attention_max_tokens={settings.attention_max_tokens}, the model's "
            f"{model.max_source_tokens})",
        )
    return q


def register_explorer_routes(app: FastAPI, ctx: ServerContext) -> None:
    """Add ``POST /attention`` (501 without a torch model), ``GET /`` and ``/static``."""

    @app.post("/attention")
    async def attention(request: Request) -> Response:
        if ctx.attention_model is None:
            raise ApiError(501, NO_ATTENTION)
        params = await ctx.params(request)
        if denied := ctx.guard.check(request, params):  # 403 bad/missing key, 429 rate limit
            return denied
        q = checked_sentence(ctx, params)
        layer, head = params.get("layer"), params.get("head")
        check_choice(ctx.attention_model, layer, head)  # 400 before the decoding
        pair = attention_route(ctx, params)

        def compute() -> bytes:  # maps, payload and JSON in the model's thread: the loop is free
            maps = attention_maps(
                ctx.attention_model, q, ctx.options, ctx.settings.attention_max_tokens, route=pair
            )
            payload = attention_payload(maps, layer, head)
            weights = _json_in_pieces(payload.pop("weights"))
            head_json = json.dumps(payload, ensure_ascii=False)[:-1]  # without its closing }
            return f'{head_json}, "weights": {weights}}}'.encode()

        # a job of its own in the model's queue: its timeout, its 503s, its cancellation
        body = await ctx.admission.call(request, compute, "attention")
        return Response(body, media_type="application/json")

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


__all__ = ["NO_ATTENTION", "STATIC_DIR", "register_explorer_routes"]
