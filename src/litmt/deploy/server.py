"""HTTP server: the LibreTranslate API, dynamic batching, and the attention-explorer page.

Routes (request and answer shapes follow LibreTranslate's ``libretranslate/app.py``):

- ``POST /translate``: ``q`` (a string or a list of strings), ``source``, ``target``,
  ``format`` (``text`` or ``html``; default text), ``alternatives`` as JSON,
  ``application/x-www-form-urlencoded`` or ``multipart/form-data`` →
  ``{"translatedText": str | list[str]}`` (a list in, a list out), with
  ``detectedLanguage`` for ``source=auto`` and ``alternatives`` when asked
  (`litmt.deploy.libretranslate`, which also adds ``/detect``, ``/frontend/settings``,
  ``/suggest`` and ``/translate_file``). Errors are ``{"error": message}``: malformed JSON,
  missing ``q``/``source``/``target`` or an unsupported pair or format → 400; a request over a configured limit
  (bytes, texts, characters, lines, tokens) → 413 naming it (LibreTranslate answers 400);
  a line over the model's source limit is translated sentence by sentence
  (`litmt.deploy.sentences`, ``split_sentences``), never truncated;
  a full queue or a dead batcher → 503 with ``Retry-After``; past ``request_timeout_s`` →
  504. litmt extension fields: ``prefix`` and ``constraints`` (`litmt.deploy.libretranslate`);
  a steered request runs as its own job in the model's thread, not in the batcher.
- ``GET /languages``: ``[{"code", "name", "targets"}]``; a multilingual model lists every
  target of each source (``target=fr`` routes to its ``<2fr>`` token,
  `litmt.decoding.languages`; one batcher per direction, all sharing the model's thread;
  an unknown direction is a 400 with the translator's one-line message).
- ``GET /health``: ``{"status": "ok", ...}`` with batching counters (queued, skipped,
  rejected); 503 when the batcher task has ended.
- ``GET /``: the attention explorer (``litmt/deploy/static/``); ``POST /attention`` with
  ``{"q": sentence}`` (optionally ``layer``: an int or ``"all"``, and ``head``: an int or
  ``"mean"``) → the greedy translation, the source/target pieces and one cross-attention
  map of the torch model (`litmt.decoding.attention_maps.collect_attention`), or every map
  with ``layer="all"``; at most ``attention_max_tokens`` source and target tokens.

API keys, the rate limit (403/429) and CORS (none by default; ``cors``) are
`litmt.deploy.access`'s.

Concurrent ``/translate`` requests are batched (`litmt.deploy.request_batcher.RequestBatcher`): the first
request of a batch waits at most ``max_wait_ms`` for others, up to ``max_batch_texts``
sentences; one worker thread runs the model, so decoding never runs twice at once. A failing
batch fails its requests (500 JSON), not the server. A request whose client hangs up (or
times out) while it waits has its queued work cancelled; the batcher skips it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import threading
import time
import urllib.parse
from asyncio import FIRST_COMPLETED
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from litmt.config import renamed_attribute
from litmt.decoding.config import DecodeConfig
from litmt.decoding.languages import Languages
from litmt.deploy import libretranslate as lt
from litmt.deploy.access import AccessConfig, AccessGuard, install_cors
from litmt.deploy.attention_view import attention_maps, attention_payload
from litmt.deploy.http_errors import ApiError
from litmt.deploy.request_batcher import BatcherDead, QueueFull, RequestBatcher
from litmt.deploy.sentences import MODES, segmenter_for
from litmt.errors import ConfigError, LitmtError

log = logging.getLogger(__name__)

Pair = tuple[str, str] | None  # a request's (source, target); None = a one-pair model

STATIC_DIR = Path(__file__).parent / "static"
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip


POSITIVE = ("max_batch_texts", "max_texts", "max_chars", "max_text_chars", "max_lines",
            "max_source_tokens", "max_body_bytes", "max_queue", "attention_max_tokens")  # fmt: skip


@dataclass
class ServeConfig:
    """Server and decoding settings (``conf/serve.yaml``, where each is explained).

    The decoding options are validated here (`DecodeConfig.from_options`), so a bad one
    stops the server at startup with a `ConfigError`, never a 400 on each request.
    """

    max_batch_texts: int = 64  # sentences decoded together at most
    max_wait_ms: float = 10.0  # how long a batch's first request waits for company
    max_queue: int = 256  # requests waiting for a batch, else 503 + Retry-After
    request_timeout_s: float = 60.0  # a request's wait for its translation, else 504
    retry_after_s: int = 1  # the Retry-After header of a 503
    max_texts: int = 64  # texts per request, else 413
    max_chars: int = 5000  # characters per request (all of q, LibreTranslate's char_limit)
    max_text_chars: int = 5000  # characters per text, else 413
    max_lines: int = 100  # lines per text, else 413
    max_source_tokens: int = 4096  # subword tokens per request (all lines), else 413
    split_sentences: str = "long"  # long | always | never (litmt.deploy.sentences)
    allow_zero_shot: bool = False  # a multilingual model: serve never-trained directions too
    max_body_bytes: int = 1_000_000  # request body, else 413
    attention_max_tokens: int = 256  # /attention: source tokens (else 413) and target budget
    cors: bool | str | list[str] = False  # allowed origins; False = same origin (access.py)
    access: AccessConfig = field(default_factory=AccessConfig)  # API keys, rate limit
    decoding: dict[str, Any] = field(default_factory=dict)  # Translator.translate options

    def __post_init__(self) -> None:
        for name in POSITIVE:
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.split_sentences not in MODES:
            raise ConfigError(
                f"split_sentences must be one of {list(MODES)}, got {self.split_sentences!r}"
            )
        if float(self.max_wait_ms) < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if float(self.request_timeout_s) <= 0:
            raise ConfigError(f"request_timeout_s must be positive, got {self.request_timeout_s}")
        try:
            DecodeConfig.from_options(self.decoding)
        except ConfigError as exc:
            raise ConfigError(f"decoding: {exc}") from None


def language_name(code: str) -> str:
    """English name of a language code (the code itself when unknown)."""
    return LANGUAGE_NAMES.get(code, code)


def _replay(body: bytes) -> Callable[[], Any]:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def read_params(
    request: Request, max_body_bytes: int, files: dict[str, tuple[str, bytes]] | None = None
) -> dict[str, Any]:
    """The request's parameters: a JSON object, or form fields (urlencoded or multipart).

    Like LibreTranslate's ``request.values``, query-string parameters count for forms.
    A form field given several times (``q=a&q=b``) becomes a list. Uploaded files go to
    `files` (name → (filename, content)) when it is given.

    Raises:
        ApiError: 413 over `max_body_bytes`; 400 malformed JSON or not a JSON object.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise ApiError(
            413, f"Request body of {declared} bytes exceeds the limit ({max_body_bytes})"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise ApiError(413, f"Request body exceeds the limit ({max_body_bytes} bytes)")
        chunks.append(chunk)
    body = b"".join(chunks)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json" or ctype.endswith("+json"):
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, f"Invalid JSON format: {exc}") from exc
        except RecursionError:  # [[[[... within the body limit
            raise ApiError(400, "Invalid JSON format: nested too deeply") from None
        if not isinstance(data, dict):
            raise ApiError(400, "Invalid JSON format: expected an object")
        return data
    params: dict[str, Any] = {}
    for key, value in urllib.parse.parse_qsl(request.url.query, keep_blank_values=True):
        params[key] = value
    if ctype in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await Request(request.scope, receive=_replay(body)).form()
        for key in form:
            values = [v for v in form.getlist(key) if isinstance(v, str)]
            if values:
                params[key] = values[0] if len(values) == 1 else values
            upload = form.get(key)
            if files is not None and not isinstance(upload, str) and upload is not None:
                files[key] = (upload.filename or "", await upload.read())
    return params


def _texts(params: dict[str, Any], settings: ServeConfig, is_json: bool) -> tuple[list[str], bool]:
    """(sentences, was a list) from ``q``, checked against the limits."""
    q = params.get("q")
    if not q:
        raise ApiError(400, "Invalid request: missing q parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    if not is_json:  # LibreTranslate normalises form line endings to LF
        texts = ["\n".join(t.splitlines()) for t in texts]
    if len(texts) > settings.max_texts:
        raise ApiError(
            413,
            f"Invalid request: request ({len(texts)} texts) exceeds text limit ({settings.max_texts})",
        )
    chars = sum(len(t) for t in texts)
    if chars > settings.max_chars:
        raise ApiError(
            413, f"Invalid request: request ({chars}) exceeds text limit ({settings.max_chars})"
        )
    for i, text in enumerate(texts):
        if len(text) > settings.max_text_chars:
            raise ApiError(
                413,
                f"Invalid request: text {i} has {len(text)} characters, over the limit "
                f"(max_text_chars={settings.max_text_chars})",
            )
        lines = text.count("\n") + 1
        if lines > settings.max_lines:
            raise ApiError(
                413,
                f"Invalid request: text {i} has {lines} lines, over the limit "
                f"(max_lines={settings.max_lines})",
            )
    return texts, batch


def _json_in_pieces(value: list[Any]) -> str:
    """JSON of nested lists of numbers, one innermost list per `json.dumps` call, so that a
    thread encoding a large attention payload lets the event loop's thread run in between
    (one call on it all would hold the GIL throughout)."""
    if not value or not isinstance(value[0], list):
        return json.dumps(value)
    return "[" + ",".join(_json_in_pieces(v) for v in value) + "]"


def create_app(
    translator: Any,
    settings: ServeConfig | None = None,
    *,
    attention_model: Any | None = None,
    engine: str = "torch",
) -> Any:
    """The FastAPI application.

    Args:
        translator: a `Translator` (torch or ct2 engine) answering ``/translate``.
        settings: limits, batching and decoding options.
        attention_model: a torch `Translator` for ``/attention`` (None: the route answers 501).
        engine: the engine's name, reported by ``/health``.
    """
    settings = settings or ServeConfig()
    options = dict(settings.decoding)
    options.pop("n_best", None)  # one translation per text
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="litmt-model")
    state: dict[str, Any] = {}
    segmenter = segmenter_for(translator, settings.split_sentences, settings.max_source_tokens)
    upload_dir = Path(tempfile.mkdtemp(prefix="litmt-files-"))  # /translate_file's results

    # a translator without directions (a one-pair stand-in) serves its src_lang -> tgt_lang
    languages = getattr(translator, "languages", None) or Languages.from_meta(
        {}, translator.src_lang, translator.tgt_lang
    )
    zero_shot = settings.allow_zero_shot
    batchers: dict[Pair, RequestBatcher] = {}  # one per direction (None: a one-pair model)

    def direction(pair: Pair) -> dict[str, Any]:
        """`Translator.translate` keywords of a direction ({} for a one-pair model)."""
        if pair is None:
            return {}
        return {"src_lang": pair[0], "tgt_lang": pair[1], "allow_zero_shot": zero_shot}

    def batcher_for(pair: Pair) -> RequestBatcher:
        """The running batcher of a direction, started on first use."""
        if pair not in batchers:
            keywords = {**options, **direction(pair)}
            batcher = RequestBatcher(
                lambda units: translator.translate(units, **keywords),
                executor,
                max_batch=settings.max_batch_texts,
                max_wait_ms=settings.max_wait_ms,
                max_queue=settings.max_queue,
            )
            batcher.start()
            batchers[pair] = batcher
        return batchers[pair]

    def route(source: str, target: str) -> Pair:
        """A request's direction (None: the one pair), or 400 for one the model lacks."""
        if not languages.multilingual:
            lt.check_pair(source, target, src, tgt)
            return None
        if source == "auto":
            source = languages.sources()[0]
        try:
            found = translator.route(source, target, allow_zero_shot=zero_shot)
        except ConfigError as exc:
            raise ApiError(400, str(exc)) from None
        return (found.src_lang, found.tgt_lang)

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        first = languages.pairs()[0] if languages.multilingual else None
        state["batcher"] = app.state.batcher = batcher_for(first)
        yield
        for batcher in list(batchers.values()):
            await batcher.stop()
        executor.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(upload_dir, ignore_errors=True)

    app = FastAPI(title="litmt", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    install_cors(app, settings.cors)  # litmt.deploy.access
    guard = app.state.access_guard = AccessGuard(settings.access)  # API keys, rate limit
    src, tgt = translator.src_lang, translator.tgt_lang

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": f"Invalid request: {exc.errors()}"}, status_code=400)

    @app.exception_handler(LitmtError)
    async def _user_error(request: Request, exc: LitmtError) -> JSONResponse:
        return JSONResponse({"error": str(exc).splitlines()[0]}, status_code=400)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": f"Internal error: {type(exc).__name__}"}, status_code=500)

    def unavailable(message: str) -> JSONResponse:
        """503 with LibreTranslate's error JSON and a Retry-After (seconds)."""
        headers = {"Retry-After": str(settings.retry_after_s)}
        return JSONResponse({"error": message}, status_code=503, headers=headers)

    async def until_disconnect(request: Request) -> None:
        """Return when the client hangs up (the body is read: only a disconnect comes)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def translate_for(
        request: Request, texts: list[str], pair: Pair = None
    ) -> list[str] | None:
        """The batcher's translation of `texts` in direction `pair`; None when the client
        went first (its queued work is cancelled, so the batcher skips it)."""
        batcher = state["batcher"] if pair is None else batcher_for(pair)
        work = asyncio.ensure_future(batcher.submit(texts))
        gone = asyncio.ensure_future(until_disconnect(request))
        try:
            done, _ = await asyncio.wait(
                {work, gone}, timeout=settings.request_timeout_s, return_when=FIRST_COMPLETED
            )
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()  # a disconnect or the timeout: the batcher skips it
        if work in done:
            return work.result()
        if gone in done:
            return None
        raise ApiError(
            504, f"Translation timed out (request_timeout_s={settings.request_timeout_s:g})"
        )

    async def batched(
        request: Request, texts: list[str], n_best: int = 1, pair: Pair = None
    ) -> Any:
        """The translations of `texts` in direction `pair` (n-best lists when `n_best` > 1),
        or the error response (503, 499) to answer."""
        plan = segmenter.plan(texts)  # lines, or sentences of long lines; 413 over a limit
        try:
            if n_best == 1:
                out = await translate_for(request, plan.units, pair)
            else:  # other options than the batch's: one job in the model's thread
                keywords = {**options, **direction(pair)}
                out = await asyncio.wait_for(
                    asyncio.get_running_loop().run_in_executor(
                        executor, lt.nbest_units, translator, plan.units, keywords, n_best
                    ),
                    settings.request_timeout_s,
                )
        except TimeoutError:
            raise ApiError(
                504, f"Translation timed out (request_timeout_s={settings.request_timeout_s:g})"
            ) from None
        except QueueFull:
            return unavailable("Server busy: too many requests are waiting; retry later")
        except BatcherDead:
            return unavailable("Server unavailable: the request batcher has stopped")
        except (LitmtError, ApiError):
            raise  # the user's mistake: 400 via its handler; a timeout: 504
        except Exception as exc:  # a failed batch: this request gets a 500, the server lives on
            log.exception("translation failed")
            raise ApiError(500, f"Cannot translate text: {exc}") from exc
        if out is None:  # nobody to answer; 499 is what proxies log for it
            return JSONResponse({"error": "Client closed the request"}, status_code=499)
        return plan.join(out) if n_best == 1 else plan.join_nbest(out)

    async def steered(
        request: Request, texts: list[str], prefixes: Any, constraints: Any, pair: Pair = None
    ) -> Any:
        """The translations of `texts` with their prefixes and constraints (one job in the
        model's thread), or the error response to answer."""
        plan = segmenter.plan(texts)  # the limits (413) as for any request
        if len(plan.units) != len(texts):
            raise ApiError(
                400,
                "Invalid request: a text with a prefix or constraints must be one line within "
                "the model's source limit",
            )

        def job() -> list[str]:
            return translator.translate(
                plan.units,
                prefixes=prefixes,
                constraints=constraints,
                **options,
                **direction(pair),
            )

        try:
            out = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(executor, job),
                settings.request_timeout_s,
            )
        except TimeoutError:
            raise ApiError(
                504, f"Translation timed out (request_timeout_s={settings.request_timeout_s:g})"
            ) from None
        return plan.join(out)

    service = lt.Service(
        src=src,
        tgt=tgt,
        tgt_name=language_name(tgt),
        char_limit=settings.max_chars,
        beam_size=DecodeConfig.from_options(options).beam_size,
        read_params=lambda request, files=None: read_params(
            request, settings.max_body_bytes, files
        ),
        texts=lambda params, is_json: _texts(params, settings, is_json),
        batched=batched,
        nbest=lambda request, texts, n, pair=None: batched(request, texts, n, pair),
        route=route,
        steered=steered,
        upload_dir=upload_dir,
        check=guard.check,
        api_keys=guard.keys_on,
        key_required=bool(settings.access.require_api_key),
    )
    lt.register_routes(app, service)  # /detect, /frontend/settings, /suggest, files

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        params = await read_params(request, settings.max_body_bytes)
        if denied := guard.check(request, params):  # 403 bad/missing key, 429 rate limit
            return denied
        return await lt.translate(request, params, service)

    @app.get("/languages")
    async def languages_route() -> JSONResponse:
        if languages.multilingual:
            codes = list(dict.fromkeys(c for pair in languages.pairs() for c in pair))
            return JSONResponse(
                [
                    {
                        "code": lt.model2iso(c),
                        "name": language_name(c),
                        "targets": [lt.model2iso(t) for t in languages.targets_of(c, zero_shot)],
                    }
                    for c in codes
                ]
            )
        return JSONResponse(
            [
                {
                    "code": lt.model2iso(src),
                    "name": language_name(src),
                    "targets": [lt.model2iso(tgt)],
                },
                {"code": lt.model2iso(tgt), "name": language_name(tgt), "targets": []},
            ]
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        batcher = state.get("batcher")
        alive = batcher is not None and batcher.alive
        return JSONResponse(
            {
                "status": "ok" if alive else "unavailable: the request batcher has stopped",
                "engine": engine,
                "source": src,
                "target": tgt,
                "directions": [f"{s}-{t}" for s, t in languages.pairs()],
                "attention": attention_model is not None,
                "batches": batcher.batches if batcher else 0,
                "largest_batch": batcher.largest_batch if batcher else 0,
                "queued": batcher.queue.qsize() if batcher else 0,
                "skipped": batcher.skipped if batcher else 0,  # requests whose client went
                "rejected": batcher.rejected if batcher else 0,  # 503: the queue was full
                "split_lines": segmenter.split_lines,  # long lines translated by sentence
            },
            status_code=200 if alive else 503,
        )

    def attention_route(params: dict[str, Any]) -> Any:
        """The `/attention` request's direction (``source``/``target``, LibreTranslate codes;
        both absent = the model's first direction), or 400 for one the model lacks."""
        source, target = params.get("source"), params.get("target")
        if not source and not target:
            return None
        if not source or not target:
            raise ApiError(400, "Invalid request: give both source and target, or neither")
        pair = route(lt.iso2model(str(source)), lt.iso2model(str(target)))  # as /translate
        if pair is None:  # a one-pair model: its pair
            return None
        return attention_model.route(*pair, allow_zero_shot=zero_shot)

    @app.post("/attention")
    async def attention(request: Request) -> JSONResponse:
        if attention_model is None:
            raise ApiError(501, "attention needs the torch model: serve a .ckpt, not an export")
        params = await read_params(request, settings.max_body_bytes)
        if denied := guard.check(request, params):  # 403 bad/missing key, 429 rate limit
            return denied
        q = params.get("q")
        if not isinstance(q, str) or not q.strip():
            raise ApiError(400, "Invalid request: q must be a non-empty string")
        if len(q) > settings.max_chars:
            raise ApiError(
                413,
                f"Invalid request: request ({len(q)}) exceeds text limit ({settings.max_chars})",
            )
        n_src = len(attention_model.tokenizer.encode_src([q.replace("\n", " ")])[0])
        cap = min(settings.attention_max_tokens, int(attention_model.max_source_tokens))
        if n_src > cap:  # refused, not truncated
            raise ApiError(
                413,
                f"Invalid request: {n_src} source tokens, over the attention limit ({cap}: "
                f"attention_max_tokens={settings.attention_max_tokens}, the model's "
                f"{attention_model.max_source_tokens})",
            )
        layer, head = params.get("layer"), params.get("head")
        pair = attention_route(params)

        def compute() -> bytes:  # maps, payload and JSON in the model's thread: the loop is free
            maps = attention_maps(
                attention_model, q, options, settings.attention_max_tokens, route=pair
            )
            payload = attention_payload(maps, layer, head)
            weights = _json_in_pieces(payload.pop("weights"))
            head_json = json.dumps(payload, ensure_ascii=False)[:-1]  # without its closing }
            return f'{head_json}, "weights": {weights}}}'.encode()

        loop = asyncio.get_running_loop()
        try:
            payload = await loop.run_in_executor(executor, compute)
        except (LitmtError, ApiError):
            raise
        except Exception as exc:  # this request gets a 500, the server lives on
            log.exception("attention failed")
            raise ApiError(500, f"Cannot compute attention: {exc}") from exc
        return Response(payload, media_type="application/json")

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


# -- running ---------------------------------------------------------------------------
class ServerThread:
    """Run an app with uvicorn in a background thread (tests, benchmarks).

    >>> with ServerThread(app) as server:
    ...     httpx.get(server.url + "/health")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **uvicorn: Any) -> None:
        """`uvicorn`: more `uvicorn.Config` options (``limit_concurrency``, ...)."""
        from uvicorn import Config, Server

        config = Config(app, host=host, port=port, log_level="warning", lifespan="on", **uvicorn)
        self.server = Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="litmt-serve")
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def build_server_app(
    model: str | Path,
    *,
    engine: str = "torch",
    device: str | None = None,
    threads: int = 0,
    attention: bool = True,
    settings: ServeConfig | None = None,
    cache_dir: str | Path | None = None,
    quantization: str = "none",
    compute_type: str = "default",
) -> Any:
    """Load `model` (a ``.ckpt`` or a CTranslate2 export) and build the app.

    An export directory always runs on ct2 and has no ``/attention``; a checkpoint runs on
    `engine`, and ``/attention`` uses its torch model when `attention` is true.
    """
    from litmt.deploy.ct2_export import is_export_dir
    from litmt.deploy.engines import load_translator

    path = Path(model)
    if is_export_dir(path) and engine != "ct2":
        log.info("%s is a CTranslate2 export: serving it with engine=ct2", path)
        engine = "ct2"
    explorer = attention and not is_export_dir(path)  # /attention runs a torch model
    translator = load_translator(
        path,
        engine=engine,
        device=device,
        threads=threads,  # torch's and CTranslate2's (litmt.runtime.threads)
        cache_dir=cache_dir,
        quantization=quantization,
        compute_type=compute_type,
    )
    attention_model = None
    if explorer:
        attention_model = (
            translator
            if engine == "torch"
            else load_translator(path, engine="torch", device=device)
        )
    return create_app(translator, settings, attention_model=attention_model, engine=engine)


def __getattr__(name: str) -> Any:
    """Old names of this module's classes, kept one release (`litmt.config.renamed_attribute`)."""
    return renamed_attribute(__name__, name, {"ServeSettings": "ServeConfig"}, globals())


__all__ = ["ApiError", "ServeConfig", "ServerThread", "build_server_app", "create_app"]
