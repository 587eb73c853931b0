"""HTTP server: the LibreTranslate API, dynamic batching, and the attention-explorer page.

`create_app` assembles the route groups; each lives in its own module:

- ``POST /translate`` and LibreTranslate's other routes (`litmt.deploy.server.routes.translate`,
  `litmt.deploy.server.routes.libretranslate`; request and answer shapes follow LibreTranslate's
  ``libretranslate/app.py``): ``q`` (a string or a list of strings), ``source``, ``target``,
  ``format`` (``text`` or ``html``), ``alternatives``, as JSON, urlencoded or multipart →
  ``{"translatedText": str | list[str]}``; litmt's ``prefix`` and ``constraints`` fields.
  A request over a limit of `ServeConfig` is a 413 naming it (LibreTranslate answers 400);
  a line over the model's source limit is translated sentence by sentence
  (`litmt.deploy.server.input.sentences`), never truncated.
- ``GET /languages`` and ``GET /health`` (`litmt.deploy.server.routes.info`): a multilingual model
  lists every target of each source (``target=fr`` routes to its ``<2fr>`` token); /health
  has the model queue's counters and is 503 when its loop has ended.
- ``GET /`` (the attention explorer page, ``litmt/deploy/server/static/``) and ``POST /attention``
  (`litmt.deploy.server.routes.explorer`).
- Errors (`litmt.deploy.server.errors`): always ``{"error": message}``.

Every decoding (plain, alternatives, prefix/constraints, /attention) is a job of one bounded
queue (`litmt.deploy.server.admission`, `litmt.deploy.server.model_queue`: one model thread; 503 with
``Retry-After`` for a full queue or work that could not finish in time, 504 past the
timeout, 499 for a client that went). Slow and idle connections are the HTTP protocol's
(`litmt.deploy.server.protocol`: header and body deadlines, connections per address, JSON
refusals). API keys, the rate limit (403/429) and CORS are `litmt.deploy.server.access`'s. Every
setting, with its default and its doc, is a field of `litmt.deploy.server.config.ServeConfig`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from litmt.config import renamed_attribute, renamed_keys
from litmt.decoding.languages import Languages
from litmt.deploy.server.access import AccessGuard, install_cors
from litmt.deploy.server.admission import Admission
from litmt.deploy.server.config import POSITIVE, ServeConfig
from litmt.deploy.server.context import ServerContext, language_name
from litmt.deploy.server.errors import ApiError, install_error_handlers
from litmt.deploy.server.input.request_params import read_params
from litmt.deploy.server.input.sentences import segmenter_for
from litmt.deploy.server.routes.explorer import register_explorer_routes
from litmt.deploy.server.routes.info import register_info_routes
from litmt.deploy.server.routes.translate import register_translate_routes

log = logging.getLogger(__name__)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the model queue; on shutdown stop it and the model's thread, and delete the
    translated files."""
    ctx: ServerContext = app.state.context
    ctx.admission.start()
    yield
    await ctx.admission.stop()
    ctx.guard.close()
    shutil.rmtree(app.state.upload_dir, ignore_errors=True)


def create_app(
    translator: Any,
    settings: ServeConfig | None = None,
    *,
    attention_model: Any | None = None,
    engine: str = "torch",
) -> FastAPI:
    """The FastAPI application.

    Args:
        translator: a `Translator` (torch or ct2 engine) answering ``/translate``.
        settings: limits, batching and decoding options (default: `ServeConfig()`).
        attention_model: a torch `Translator` for the explorer's ``/attention`` (None: the
            route answers 501).
        engine: the engine's name, reported by ``/health``.
    """
    settings = settings or ServeConfig()
    options = dict(settings.decoding)
    options.pop("n_best", None)  # one translation per text
    segmenter = segmenter_for(translator, settings.split_sentences, settings.max_source_tokens)
    # a translator without directions (a one-pair stand-in) serves its src_lang -> tgt_lang
    languages = getattr(translator, "languages", None) or Languages.from_meta(
        {}, translator.src_lang, translator.tgt_lang
    )
    app = FastAPI(title="litmt", lifespan=_lifespan, docs_url="/docs", redoc_url=None)
    install_cors(app, settings.cors)  # litmt.deploy.server.access
    app.state.context = ctx = ServerContext(
        translator=translator,
        settings=settings,
        options=options,
        languages=languages,
        segmenter=segmenter,
        admission=Admission(translator, settings, options),
        guard=AccessGuard(settings.access),  # API keys, rate limit
        engine=engine,
        attention_model=attention_model,
    )
    app.state.access_guard = ctx.guard
    app.state.upload_dir = Path(tempfile.mkdtemp(prefix="litmt-files-"))  # /translate_file's
    install_error_handlers(app)
    register_translate_routes(app, ctx, app.state.upload_dir)
    register_info_routes(app, ctx)
    register_explorer_routes(app, ctx)
    return app


def build_server_app(
    model: str | Path,
    *,
    engine: str = "torch",
    device: str | None = None,
    explorer: bool = True,
    settings: ServeConfig | None = None,
    attention: bool | None = None,
    **load: Any,
) -> FastAPI:
    """Load `model` (a ``.ckpt``, a CTranslate2 or an ONNX export) and build the app.

    A CTranslate2 export always runs on ct2, an ONNX export on onnx, and neither has
    ``/attention``; a checkpoint runs on
    `engine`, and the attention explorer (``/attention``) uses its torch model when
    `explorer` is true.

    Args:
        load: more `litmt.deploy.loader.load_translator` keywords (``threads``,
            ``compute_type``, ``quantization``, the ct2 cache directory).
        attention: the old name of `explorer`, accepted for one release with a
            deprecation line.
    """
    from litmt.deploy.export.ct2 import is_export_dir
    from litmt.deploy.export.onnx import is_onnx_dir
    from litmt.deploy.loader import load_translator

    if attention is not None:  # the old name, for one release
        renamed = renamed_keys(
            {"attention": attention}, {"attention": "explorer"}, "build_server_app"
        )
        explorer = bool(renamed["explorer"])
    path = Path(model)
    if is_export_dir(path) and engine != "ct2":
        log.info("%s is a CTranslate2 export: serving it with engine=ct2", path)
        engine = "ct2"
    if is_onnx_dir(path) and engine != "onnx":
        log.info("%s is an ONNX export: serving it with engine=onnx", path)
        engine = "onnx"
    # threads: torch's and CTranslate2's (litmt.runtime.threads)
    translator = load_translator(path, engine=engine, device=device, **load)
    attention_model = None
    if explorer and not is_export_dir(path) and not is_onnx_dir(path):  # /attention: torch
        attention_model = (
            translator
            if engine == "torch"
            else load_translator(path, engine="torch", device=device)
        )
    return create_app(translator, settings, attention_model=attention_model, engine=engine)


def __getattr__(name: str) -> Any:
    """Old names of this module's classes, kept one release (`litmt.config.renamed_attribute`)."""
    return renamed_attribute(__name__, name, {"ServeSettings": "ServeConfig"}, globals())


__all__ = [
    "POSITIVE",
    "ApiError",
    "ServeConfig",
    "build_server_app",
    "create_app",
    "language_name",
    "read_params",
]
