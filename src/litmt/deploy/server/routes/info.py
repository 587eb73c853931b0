"""What the server serves and how it is: ``GET /languages`` and ``GET /health``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from litmt.deploy.server.context import ServerContext, language_name
from litmt.deploy.server.routes import libretranslate as lt


def languages_payload(ctx: ServerContext) -> list[dict[str, Any]]:
    """``/languages`` in LibreTranslate's shape: ``[{"code", "name", "targets"}]``; a
    multilingual model lists every target of each source."""
    languages, zero_shot = ctx.languages, ctx.settings.allow_zero_shot
    if languages.multilingual:
        codes = list(dict.fromkeys(c for pair in languages.pairs() for c in pair))
        return [
            {
                "code": lt.model2iso(c),
                "name": language_name(c),
                "targets": [lt.model2iso(t) for t in languages.targets_of(c, zero_shot)],
            }
            for c in codes
        ]
    src, tgt = ctx.src, ctx.tgt
    return [
        {"code": lt.model2iso(src), "name": language_name(src), "targets": [lt.model2iso(tgt)]},
        {"code": lt.model2iso(tgt), "name": language_name(tgt), "targets": []},
    ]


def health_payload(ctx: ServerContext) -> tuple[dict[str, Any], bool]:
    """``/health``'s answer with the model queue's counters, and whether the server is well:
    its loop runs and the model thread's current job (``job_age_s``) has not run past
    ``request_timeout_s`` (a job the thread cannot be interrupted in: an orchestrator should
    restart the server)."""
    queue, limit = ctx.admission.queue, ctx.admission.settings.request_timeout_s
    age = queue.job_age_s
    stuck = age > limit
    alive = queue.alive and not stuck
    if not queue.alive:
        status = "unavailable: the model queue has stopped"
    elif stuck:
        status = f"unavailable: the model thread's job has run {age:.0f} s, past request_timeout_s={limit:g}"
    else:
        status = "ok"
    payload = {
        "status": status,
        "job_age_s": round(age, 3),  # the model thread's current job; 0 when idle
        "engine": ctx.engine,
        "source": ctx.src,
        "target": ctx.tgt,
        "directions": [f"{s}-{t}" for s, t in ctx.languages.pairs()],
        "attention": ctx.attention_model is not None,
        **ctx.admission.counters(),  # queued, batches, 503s, 504s, service times
        "split_lines": ctx.segmenter.split_lines,  # long lines translated by sentence
    }
    return payload, alive


def register_info_routes(app: FastAPI, ctx: ServerContext) -> None:
    """Add ``GET /languages`` and ``GET /health`` (503 when the model queue has stopped or its
    thread is stuck on a job past ``request_timeout_s``)."""

    @app.get("/languages")
    async def languages_route() -> JSONResponse:
        return JSONResponse(languages_payload(ctx))

    @app.get("/health")
    async def health() -> JSONResponse:
        payload, alive = health_payload(ctx)
        return JSONResponse(payload, status_code=200 if alive else 503)


__all__ = ["health_payload", "languages_payload", "register_info_routes"]
