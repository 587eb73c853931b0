"""LibreTranslate parity: what its clients send and expect beyond a plain ``/translate``.

Shapes, messages and status codes follow LibreTranslate's ``libretranslate/app.py`` and
``libretranslate/language.py`` (read at commit 39429cb):

- Language codes: lowercased, and LibreTranslate's aliases accepted (``pt-BR`` → ``pb``,
  ``zh-Hans`` → ``zh``, ``zh-Hant`` → ``zt``; `iso2model`), answered back in ISO form
  (`model2iso`). Regional codes such as ``en-US`` are refused, as LibreTranslate does.
- ``source=auto``: the answer gains ``detectedLanguage`` (``{"confidence", "language"}``,
  a list of them for a list ``q``), and each text is translated from its detected language.
  ``POST /detect`` answers LibreTranslate's list of ``{"confidence": 0-100, "language"}``,
  best first (`litmt.deploy.server.input.detect`). A model with one source language (a one-pair
  model, or a multilingual one like en-de + en-fr) reads only that language, so detection is
  it, with the confidence LibreTranslate gives a sure answer (100.0). A model with several
  source languages detects among them only (lingua); where lingua is not installed or does
  not know one of them, it refuses ``source=auto`` and ``/detect`` with a 400 naming them
  (`litmt.deploy.server.context.ServerContext.auto_source`).
- ``alternatives=N``: ``alternatives`` holds up to N other translations per text (the
  beam's n-best after the best, duplicates dropped); N is capped by the beam size
  (``decoding.beam_size``), so greedy decoding has none. Not for ``format=html``, as in
  LibreTranslate.
- ``format=html``: the text nodes are translated and the markup kept (`HtmlText`, on the
  standard library's `html.parser`); ``<script>``/``<style>`` content is left alone.
- ``GET /frontend/settings`` (the web UI's first call), ``POST /suggest`` (403: disabled),
  ``POST /translate_file`` for ``.txt`` (multipart ``file``, ``source``, ``target``) →
  ``{"translatedFileUrl": ...}``, fetched from ``GET /download_file/{name}``.

litmt extension fields of ``POST /translate`` (not in LibreTranslate; its clients never send
them): ``prefix`` (the translation begins with it) and ``constraints`` (target phrases the
translation must contain; `litmt.decoding.steering`). For a string ``q``: a string and a list
of strings; for a list ``q``: one entry per text (a string or null; a list of strings or
null). ``constraints`` must come as JSON (a form field cannot carry a list). A steered text
must be one line within the model's source limit (it is not split into sentences), with
``format=text`` and no ``alternatives``; a malformed field or a bad combination is a 400
with one line (so is a prefix or constraint with characters the model's vocabulary lacks),
and engine=ct2 refuses ``constraints`` (400). A steered answer adds ``constraints_met`` (a
bool, a list for a list ``q``): false where the constraints could not all be met within the
output budget; the text is then the best translation without them.

Routes are added by `register_routes`, called once by
`litmt.deploy.server.routes.translate.register_translate_routes`.
"""

from __future__ import annotations

import html
import time
import uuid
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from litmt.deploy.server.errors import ApiError

ALIASES = {"pb": "pt-BR", "zh": "zh-Hans", "zt": "zh-Hant"}  # model code → ISO code
REV_ALIASES = {iso.lower(): code for code, iso in ALIASES.items()}
SURE = 100.0  # LibreTranslate's confidence for a language it is sure of
FILE_FORMATS = [".txt"]  # /translate_file
FILE_TTL_S = 1800  # translated files are deleted after this long (LibreTranslate: 30 min)
NO_TRANSLATE = {"script", "style"}  # elements whose text is not prose
MAX_FILE_NAME = 200  # bytes of a translated file's kept name (a file system takes 255)


def iso2model(code: Any) -> Any:
    """A request's language code as the model names it: lowercased, aliases resolved."""
    if not isinstance(code, str):
        return code
    code = code.lower()
    return REV_ALIASES.get(code, code)


def model2iso(code: str) -> str:
    """A model's language code as LibreTranslate answers it (``zh`` → ``zh-Hans``)."""
    code = code.lower()
    return ALIASES.get(code, code)


def detection(src: str) -> dict[str, Any]:
    """The detected language of any text: the model's one source language, for sure."""
    return {"confidence": SURE, "language": model2iso(src)}


def check_pair(source: str, target: str, src: str, tgt: str, *, auto: bool = True) -> None:
    """400 ``"xx is not supported"`` (LibreTranslate's message) unless this is the model's
    pair; ``source="auto"`` is the model's source when `auto`."""
    if source != src and not (auto and source == "auto"):
        raise ApiError(400, f"{source} is not supported")
    if target != tgt:
        raise ApiError(400, f"{target} is not supported")


def text_format(params: dict[str, Any]) -> str:
    fmt = params.get("format") or "text"
    if fmt not in ("text", "html"):
        raise ApiError(400, f"{fmt} format is not supported")
    return str(fmt)


def num_alternatives(params: dict[str, Any]) -> int:
    """``alternatives`` as LibreTranslate reads it: an int, negative = 0; else 400."""
    try:  # OverflowError: JSON's 1e999 (infinity)
        return max(0, int(params.get("alternatives", 0) or 0))
    except (TypeError, ValueError, OverflowError):
        raise ApiError(400, "Invalid request: alternatives parameter is not a number") from None


def filter_unique(seq: list[str], best: str) -> list[str]:
    """`seq` without duplicates, the best translation or empty strings, order kept."""
    seen = {best, ""}
    out = []
    for x in seq:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def nbest_units(translator: Any, units: list[str], options: dict[str, Any], n: int) -> list[Any]:
    """Per unit (one line or sentence), its n-best translations, best first
    (`litmt.deploy.server.input.sentences.Plan.join_nbest` rebuilds the texts)."""
    found = translator.translate(units, **{**options, "n_best": n, "return_scores": True})
    return [[t for t, *_ in hyps] for hyps in found]


# -- format=html ------------------------------------------------------------------------
class HtmlText(HTMLParser):
    """An HTML fragment as markup and text nodes: ``texts`` are the nodes to translate
    (stripped, entities decoded), `render` puts translations back into the markup."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str | int] = []  # markup, or the index of a text node
        self.texts: list[str] = []
        self.open: list[str] = []
        self.feed(source)
        self.close()

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.parts.append(self.get_starttag_text() or "")
        self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: Any) -> None:
        self.parts.append(self.get_starttag_text() or "")

    def handle_endtag(self, tag: str) -> None:
        self.parts.append(f"</{tag}>")
        if tag in self.open:
            del self.open[len(self.open) - 1 - self.open[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        core = data.strip()
        if not core or (self.open and self.open[-1] in NO_TRANSLATE):
            raw = self.open and self.open[-1] in NO_TRANSLATE
            self.parts.append(data if raw else html.escape(data, quote=False))
            return
        lead, trail = data[: len(data) - len(data.lstrip())], data[len(data.rstrip()) :]
        self.parts.extend([lead, len(self.texts), trail])
        self.texts.append(core)

    def handle_comment(self, data: str) -> None:
        self.parts.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.parts.append(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.parts.append(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self.parts.append(f"<![{data}]>")

    def render(self, translations: list[str]) -> str:
        return "".join(
            html.escape(translations[p], quote=False) if isinstance(p, int) else p
            for p in self.parts
        )


# -- routes -----------------------------------------------------------------------------
class Service(Protocol):
    """What the LibreTranslate routes need from the server; implemented by
    `litmt.deploy.server.routes.translate.TranslateService`. Every decoding method raises
    `ApiError` (503, 504, 499, 500) when the request cannot be answered."""

    src: str
    tgt: str
    tgt_name: str  # the target language's English name
    char_limit: int  # /frontend/settings' charLimit: characters of one text
    beam_size: int  # caps alternatives
    upload_dir: Path
    # /frontend/settings' default source: {"code": "auto", ...}, or the model's first source
    # language when it has several and no detector (auto is then a 400)
    default_source: dict[str, str]
    api_keys: bool  # /frontend/settings' apiKeys: keys are on
    key_required: bool  # /frontend/settings' keyRequired

    async def read_params(self, request: Request, files: Any = None) -> dict[str, Any]: ...

    def texts(self, params: dict[str, Any], is_json: bool) -> tuple[list[str], bool]:
        """(the texts of ``q``, whether ``q`` was a list), checked against the limits."""

    def check(self, request: Request, params: dict[str, Any], cost: int = 1) -> Any:
        """403 / 429 to answer (keys, rate limit), or None."""

    def auto_source(self) -> str:
        """The model's one source language (``source=auto`` without detection); ApiError 400
        for several."""

    async def detect(self, texts: list[str], batch: bool) -> list[dict[str, Any]]:
        """``/detect``'s answer for the texts of ``q`` (LibreTranslate's list, best first)."""

    async def auto_routes(
        self, texts: list[str], target: str, batch: bool
    ) -> tuple[list[dict[str, Any]], list[Any]]:
        """``source=auto``: per text, its detected language and its direction (as `route`)."""

    def route(self, source: str, target: str) -> Any:
        """The direction `batched` and `steered` take as ``pair=`` (None: a one-pair
        model); ApiError 400 for a pair the model does not translate."""

    async def batched(
        self, request: Request, texts: list[str], n_best: int = 1, pair: Any = None
    ) -> list[Any]:
        """Translations of `texts` (n-best lists when `n_best` > 1)."""

    async def steered(
        self, request: Request, texts: list[str], prefixes: Any, constraints: Any, pair: Any = None
    ) -> tuple[list[str], list[bool]]:
        """Translations of `texts` with litmt's prefix and constraints fields, and whether
        each meets all its constraints."""


def steering(params: dict[str, Any], n: int, batch: bool) -> tuple[Any, Any] | None:
    """The litmt fields ``prefix`` and ``constraints`` as per-text lists (None: neither was
    sent); their values are checked by the translator (`litmt.decoding.steering`)."""
    prefix, constraints = params.get("prefix"), params.get("constraints")
    if prefix is None and constraints is None:
        return None
    if batch:
        for name, value in (("prefix", prefix), ("constraints", constraints)):
            if value is not None and not (isinstance(value, list) and len(value) == n):
                raise ApiError(
                    400, f"Invalid request: {name} must be a list with one entry per text of q"
                )
        return prefix, constraints
    return (
        None if prefix is None else [prefix],
        None if constraints is None else [constraints],
    )


async def decode(
    request: Request,
    texts: list[str],
    svc: Service,
    pair: Any,
    fmt: str,
    n_alt: int,
    steer: tuple[Any, Any] | None,
) -> tuple[list[str], list[list[str]], list[bool]]:
    """(translations, alternatives, constraints met) of `texts`, all in direction `pair`."""
    alternatives: list[list[str]] = [[] for _ in texts]
    met = [True] * len(texts)
    if steer is not None:
        translated, met = await svc.steered(request, texts, *steer, pair=pair)
    elif fmt == "html":
        docs = [HtmlText(t) for t in texts]
        nodes = [node for d in docs for node in d.texts]
        out = await svc.batched(request, nodes, pair=pair) if nodes else []
        translated, start = [], 0
        for d in docs:
            translated.append(d.render(out[start : start + len(d.texts)]))
            start += len(d.texts)
    elif n_alt > 0 and min(n_alt + 1, svc.beam_size) > 1:
        found = await svc.batched(request, texts, min(n_alt + 1, svc.beam_size), pair=pair)
        translated = [hyps[0] for hyps in found]
        alternatives = [filter_unique(hyps[1:], hyps[0]) for hyps in found]
    else:
        translated = await svc.batched(request, texts, pair=pair)
    return translated, alternatives, met


async def translate(request: Request, params: dict[str, Any], svc: Service) -> JSONResponse:
    """``POST /translate``: every LibreTranslate option (see the module docstring)."""
    is_json = request.headers.get("content-type", "").split(";")[0].strip().endswith("json")
    texts, batch = svc.texts(params, is_json)
    for name in ("source", "target"):
        if not params.get(name):
            raise ApiError(400, f"Invalid request: missing {name} parameter")
    n_alt = num_alternatives(params)
    source, target = iso2model(str(params["source"])), iso2model(str(params["target"]))
    if source == "auto":  # per text: its detected language and direction
        found_langs, pairs = await svc.auto_routes(texts, target, batch)
    else:
        pairs = [svc.route(source, target)] * len(texts)
    fmt = text_format(params)
    steer = steering(params, len(texts), batch)
    if steer is not None and (fmt == "html" or n_alt > 0):
        raise ApiError(
            400,
            "Invalid request: prefix and constraints work with format=text only, "
            "without alternatives",
        )
    groups: dict[Any, list[int]] = {}  # direction -> the indices of its texts
    for i, pair in enumerate(pairs):
        groups.setdefault(pair, []).append(i)
    translated, alternatives, met = [""] * len(texts), [[]] * len(texts), [True] * len(texts)
    for pair, idx in groups.items():
        part = None if steer is None else tuple(None if v is None else [v[i] for i in idx] for v in steer)  # fmt: skip
        out = await decode(request, [texts[i] for i in idx], svc, pair, fmt, n_alt, part)
        for j, i in enumerate(idx):
            translated[i], alternatives[i], met[i] = out[0][j], out[1][j], out[2][j]
    result: dict[str, Any] = {"translatedText": translated if batch else translated[0]}
    if source == "auto":
        result["detectedLanguage"] = found_langs if batch else found_langs[0]
    if n_alt > 0:
        result["alternatives"] = alternatives if batch else alternatives[0]
    if steer is not None:
        result["constraints_met"] = met if batch else met[0]
    return JSONResponse(result)


def _clean(upload_dir: Path) -> None:
    """Delete translated files older than `FILE_TTL_S`."""
    cutoff = time.time() - FILE_TTL_S
    for path in upload_dir.iterdir():
        if path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)


def checked_upload(
    files: dict[str, tuple[str, bytes]], params: dict[str, Any]
) -> tuple[str, bytes]:
    """The upload's safe file name and bytes, or a 400 for a missing file, language, name or
    format, or a name over `MAX_FILE_NAME` bytes."""
    if "file" not in files:
        raise ApiError(400, "Invalid request: missing file parameter")
    for name in ("source", "target"):
        if not params.get(name):
            raise ApiError(400, f"Invalid request: missing {name} parameter")
    filename, data = files["file"]
    if filename == "":
        raise ApiError(400, "Invalid request: empty file")
    if Path(filename).suffix not in FILE_FORMATS:
        raise ApiError(400, "Invalid request: file format not supported")
    safe = "".join(c for c in Path(filename).name if c.isalnum() or c in "._-") or "file.txt"
    if len(safe.encode("utf-8")) > MAX_FILE_NAME:  # refused before it is translated
        raise ApiError(
            400, f"Invalid request: the file name is too long (over {MAX_FILE_NAME} bytes)"
        )
    return safe, data


async def translate_file(request: Request, svc: Service) -> JSONResponse:
    """``POST /translate_file``: a UTF-8 text file translated line by line, every check done
    before decoding; the answer is the URL of the translated file (kept 30 minutes)."""
    files: dict[str, tuple[str, bytes]] = {}
    params = await svc.read_params(request, files=files)
    size = len(files["file"][1]) if "file" in files else 0
    cost = max(1, size // max(1, svc.char_limit))  # LibreTranslate: file bytes / char_limit
    if denied := svc.check(request, params, cost):  # 403 bad/missing key, 429 rate limit
        return denied
    safe, data = checked_upload(files, params)
    source, target = iso2model(str(params["source"])), iso2model(str(params["target"]))
    pair = svc.route(source, target)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "Invalid request: the file is not UTF-8 text") from None
    ends_with_newline = text.endswith("\n")
    texts, _ = svc.texts({"q": text.rstrip("\n") or " "}, False)  # the request limits
    out = await svc.batched(request, texts, pair=pair)
    svc.upload_dir.mkdir(parents=True, exist_ok=True)
    _clean(svc.upload_dir)
    name = f"{uuid.uuid4()}.{safe}"
    (svc.upload_dir / name).write_text(out[0] + ("\n" if ends_with_newline else ""), "utf-8")
    url = str(request.url_for("download_file", filename=name))
    return JSONResponse({"translatedFileUrl": url})


def register_routes(app: FastAPI, svc: Service) -> None:
    """Add ``/detect``, ``/frontend/settings``, ``/suggest``, ``/translate_file`` and
    ``/download_file/{name}`` to `app`."""

    @app.post("/detect")
    async def detect(request: Request) -> JSONResponse:
        params = await svc.read_params(request)
        if denied := svc.check(request, params):  # 403 bad/missing key, 429 rate limit
            return denied
        is_json = request.headers.get("content-type", "").split(";")[0].strip().endswith("json")
        texts, batch = svc.texts(params, is_json)  # 400 without q; 413 over the limits
        # the model's one source for sure, else detected among its sources (400 if it cannot)
        return JSONResponse(await svc.detect(texts, batch))

    @app.get("/frontend/settings")
    async def frontend_settings() -> JSONResponse:
        return JSONResponse(
            {
                "charLimit": svc.char_limit,
                "frontendTimeout": 500,  # LibreTranslate's default (ms before translating)
                "apiKeys": svc.api_keys,
                "keyRequired": svc.key_required,
                "suggestions": False,
                "filesTranslation": True,
                "supportedFilesFormat": FILE_FORMATS,
                "language": {
                    "source": svc.default_source,  # auto only where it is answered
                    "target": {"code": model2iso(svc.tgt), "name": svc.tgt_name},
                },
            }
        )

    @app.post("/suggest")
    async def suggest() -> JSONResponse:
        raise ApiError(403, "Suggestions are disabled on this server.")

    @app.post("/translate_file")
    async def translate_file_route(request: Request) -> JSONResponse:
        return await translate_file(request, svc)

    @app.get("/download_file/{filename}")
    async def download_file(filename: str) -> FileResponse:
        path = (svc.upload_dir / filename).resolve()
        if path.parent != svc.upload_dir.resolve():
            raise ApiError(400, "Invalid filename")
        if not path.is_file():
            raise ApiError(404, "File not found (translated files are kept 30 minutes)")
        return FileResponse(path, filename=filename.split(".", 1)[1], media_type="text/plain")


__all__ = ["HtmlText", "Service", "iso2model", "model2iso", "register_routes", "translate"]
